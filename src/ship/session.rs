//! A connection to PostgreSQL on which every wait for the server has a deadline.
//!
//! The client library (tokio-postgres) bounds only the TCP connect with `connect_timeout`: a
//! server that accepts the connection and then says nothing, a TLS handshake that never ends,
//! a statement that never gets an answer, a row that never comes would hold the caller for
//! ever. So the library is driven here on a small current-thread runtime of the session's own,
//! and each step is given a client-side deadline:
//!
//! * the whole connection — TCP, TLS, startup and authentication — the URL's
//!   `connect_timeout` for each host tried ([`Target::connect_deadline`]);
//! * each statement, from its sending to its last row, the `statement_timeout` the server is
//!   told to keep, plus a margin for the server's own cancellation to come back first
//!   ([`Target::statement_deadline`]), so that a live server's error (`canceling statement
//!   due to statement timeout`, or `... lock timeout` for a lock wait) is what a caller
//!   usually sees, and a silent server still cannot hold it.
//!
//! A deadline that passes is [`ShipError::NoAnswer`]; the session is then in no state to
//! trust and is dropped by its caller, which closes the connection.
//!
//! Invariant: no call of this module waits on the server without a deadline.

use std::future::Future;
use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement, Transaction};

use super::ShipError;
use super::connect::Target;

/// The deadline of one step and what to say when it passes.
#[derive(Debug, Clone)]
pub struct Bound {
    target: String,
    after: Duration,
}

impl Bound {
    /// `step`, or [`ShipError::NoAnswer`] naming `what` once the deadline has passed.
    pub async fn answer<T>(
        &self,
        what: &str,
        step: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, ShipError> {
        match tokio::time::timeout(self.after, step).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(ShipError::Server {
                target: self.target.clone(),
                error,
            }),
            Err(_) => Err(self.no_answer(what)),
        }
    }

    fn no_answer(&self, what: &str) -> ShipError {
        ShipError::NoAnswer {
            target: self.target.clone(),
            what: what.to_string(),
            after_ms: u64::try_from(self.after.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// A connection whose every wait on the server is bounded (see the module's comment).
pub struct Session {
    runtime: tokio::runtime::Runtime,
    client: Client,
    statement: Bound,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Session({})", self.statement.target)
    }
}

impl Session {
    /// Connects to `target` within its connect deadline, then tells the server the statement
    /// and lock timeouts to keep.
    pub(crate) fn open<T>(
        target: &Target,
        config: &tokio_postgres::Config,
        tls: T,
    ) -> Result<Session, ShipError>
    where
        T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket> + 'static + Send,
        T::Stream: Send + 'static,
    {
        let shown = target.shown().to_string();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| ShipError::Runtime {
                target: shown.clone(),
                source,
            })?;
        let connecting = Bound {
            target: shown.clone(),
            after: target.connect_deadline(),
        };
        let (client, connection) = runtime.block_on(connecting.answer(
            "the connection (TCP, TLS, startup, authentication)",
            config.connect(tls),
        ))?;
        // The connection's messages are read by this task, which runs whenever the session
        // waits on the runtime; dropping the runtime ends it and closes the socket.
        runtime.spawn(async move {
            let _ = connection.await;
        });
        let session = Session {
            runtime,
            client,
            statement: Bound {
                target: shown,
                after: target.statement_deadline(),
            },
        };
        session.batch_execute(&format!(
            "SET statement_timeout = '{}ms'; SET lock_timeout = '{}ms'",
            target.statement_timeout().as_millis(),
            target.lock_timeout().as_millis(),
        ))?;
        Ok(session)
    }

    /// Runs `work` on the client, each of its steps bounded by the caller through
    /// [`Bound::answer`] (the bound is given to it).
    pub fn run<T>(
        &mut self,
        work: impl AsyncFnOnce(&mut Client, &Bound) -> Result<T, ShipError>,
    ) -> Result<T, ShipError> {
        let Session {
            runtime,
            client,
            statement,
        } = self;
        runtime.block_on(work(client, statement))
    }

    /// Runs `work` in a transaction, committed when it returns `Ok`, rolled back otherwise.
    pub fn transaction<T>(
        &mut self,
        work: impl AsyncFnOnce(&Transaction<'_>, &Bound) -> Result<T, ShipError>,
    ) -> Result<T, ShipError> {
        self.run(async |client, bound| {
            let transaction = bound.answer("BEGIN", client.transaction()).await?;
            let value = work(&transaction, bound).await?;
            bound.answer("COMMIT", transaction.commit()).await?;
            Ok(value)
        })
    }

    /// Statements of the simple query protocol, separated by `;`.
    pub fn batch_execute(&self, sql: &str) -> Result<(), ShipError> {
        self.runtime.block_on(
            self.statement
                .answer("a statement", self.client.batch_execute(sql)),
        )
    }

    pub fn prepare(&self, sql: &str) -> Result<Statement, ShipError> {
        self.runtime.block_on(
            self.statement
                .answer("a statement's preparation", self.client.prepare(sql)),
        )
    }

    pub fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, ShipError> {
        self.runtime.block_on(
            self.statement
                .answer("a query", self.client.query(sql, params)),
        )
    }

    pub fn query_one(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Row, ShipError> {
        self.runtime.block_on(
            self.statement
                .answer("a query", self.client.query_one(sql, params)),
        )
    }

    pub fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, ShipError> {
        self.runtime.block_on(
            self.statement
                .answer("a query", self.client.query_opt(sql, params)),
        )
    }

    pub fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, ShipError> {
        self.runtime.block_on(
            self.statement
                .answer("a statement", self.client.execute(sql, params)),
        )
    }

    /// The rows of a query as they arrive, until `is_full` says the page holds enough (the rest
    /// is left unread), all within one statement's deadline.
    pub fn query_page(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        mut is_full: impl FnMut(&[Row]) -> bool,
    ) -> Result<Vec<Row>, ShipError> {
        use futures_util::TryStreamExt;
        let reading = async {
            let stream = self.client.query_raw(sql, params.iter().copied()).await?;
            let mut stream = std::pin::pin!(stream);
            let mut rows = Vec::new();
            while let Some(row) = stream.try_next().await? {
                rows.push(row);
                if is_full(&rows) {
                    break;
                }
            }
            Ok(rows)
        };
        self.runtime
            .block_on(self.statement.answer("a query's rows", reading))
    }
}
