//! A fake PostgreSQL server on 127.0.0.1 that speaks just enough of the protocol to stand for
//! an impostor, a hostile server or a hung one: it declines TLS (`N` to an SSLRequest), then
//! answers the startup message as told, and records what the client sent.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The SSLRequest code of the protocol.
const SSL_REQUEST_CODE: u32 = 80_877_103;

/// What the fake server answers to the startup message.
#[derive(Clone)]
pub enum Answer {
    /// AuthenticationCleartextPassword, then an error once a password came.
    CleartextPassword,
    /// An ErrorResponse (severity FATAL) with this message.
    Error(String),
    /// Authentication ok and ready for a query, then never another byte: a server hung
    /// after the connection was made.
    SilentAfterStartup,
}

/// What the clients sent, over every connection.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    pub ssl_requests: usize,
    pub startups: usize,
    /// The passwords of every PasswordMessage (`p`).
    pub passwords: Vec<String>,
}

pub struct FakePg {
    pub port: u16,
    seen: Arc<Mutex<Seen>>,
}

impl FakePg {
    /// Listens on a free port of 127.0.0.1 and serves every connection with `answer`.
    pub fn start(answer: Answer) -> FakePg {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port on 127.0.0.1");
        let port = listener.local_addr().expect("its address").port();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let seen = Arc::clone(&shared);
                let answer = answer.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &answer, &seen);
                });
            }
        });
        FakePg { port, seen }
    }

    pub fn seen(&self) -> Seen {
        self.seen
            .lock()
            .expect("no thread panicked holding it")
            .clone()
    }
}

fn read_u32(stream: &mut TcpStream) -> std::io::Result<u32> {
    let mut bytes = [0u8; 4];
    stream.read_exact(&mut bytes)?;
    Ok(u32::from_be_bytes(bytes))
}

fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![kind];
    bytes.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    bytes.extend_from_slice(body);
    bytes
}

fn error_response(text: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (field, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "28P01"),
        (b'M', text),
    ] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    message(b'E', &body)
}

fn serve(mut stream: TcpStream, answer: &Answer, seen: &Mutex<Seen>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    // The startup phase: SSLRequests (declined) until the startup message.
    loop {
        let length = read_u32(&mut stream)? as usize;
        let code = read_u32(&mut stream)?;
        let mut rest = vec![0u8; length.saturating_sub(8)];
        stream.read_exact(&mut rest)?;
        if code == SSL_REQUEST_CODE {
            seen.lock().expect("not poisoned").ssl_requests += 1;
            stream.write_all(b"N")?;
            continue;
        }
        seen.lock().expect("not poisoned").startups += 1;
        break;
    }
    match answer {
        Answer::Error(text) => {
            stream.write_all(&error_response(text))?;
            return Ok(());
        }
        Answer::CleartextPassword => {
            stream.write_all(&message(b'R', &3u32.to_be_bytes()))?;
        }
        Answer::SilentAfterStartup => {
            stream.write_all(&message(b'R', &0u32.to_be_bytes()))?;
            stream.write_all(&message(b'Z', b"I"))?;
            // Reads what comes and says nothing, until the client goes away.
            stream.set_read_timeout(None)?;
            let mut sink = [0u8; 4096];
            while stream.read(&mut sink)? > 0 {}
            return Ok(());
        }
    }
    let mut kind = [0u8; 1];
    stream.read_exact(&mut kind)?;
    let length = read_u32(&mut stream)? as usize;
    let mut body = vec![0u8; length.saturating_sub(4)];
    stream.read_exact(&mut body)?;
    if kind[0] == b'p' {
        let password = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(&body));
        seen.lock()
            .expect("not poisoned")
            .passwords
            .push(password.into_owned());
    }
    stream.write_all(&error_response("password authentication failed"))?;
    Ok(())
}
