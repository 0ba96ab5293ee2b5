/*
 * A fault injector for the real binaries (tests/it/flaky_disk.rs), loaded with LD_PRELOAD.
 *
 * It remembers the file descriptors that open(2) and its relatives return for a path ending
 * in "journal.redb", and while the file named by $RUNJOURNAL_TEST_FAULT_CONTROL exists, it
 * fails write(2), pwrite(2), fsync(2) and fdatasync(2) on them with EIO, as a flaky disk
 * would. Every other file, and every call while the control file is absent, goes to libc.
 * The test compiles it with `cc` into its own directory.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define TRACKED_FDS 65536

/* 1 for a descriptor of a journal file. Written on open and close, read on every write. */
static volatile unsigned char is_journal_fd[TRACKED_FDS];

static int is_journal_path(const char *path) {
    static const char suffix[] = "journal.redb";
    size_t length, suffix_length = sizeof(suffix) - 1;
    if (path == NULL) {
        return 0;
    }
    length = strlen(path);
    return length >= suffix_length && strcmp(path + length - suffix_length, suffix) == 0 &&
           (length == suffix_length || path[length - suffix_length - 1] == '/');
}

static void remember(int fd, const char *path) {
    if (fd >= 0 && fd < TRACKED_FDS) {
        is_journal_fd[fd] = (unsigned char)is_journal_path(path);
    }
}

/* Whether a call on `fd` fails now: a journal descriptor while the control file exists. */
static int is_failing(int fd) {
    const char *control;
    if (fd < 0 || fd >= TRACKED_FDS || !is_journal_fd[fd]) {
        return 0;
    }
    control = getenv("RUNJOURNAL_TEST_FAULT_CONTROL");
    return control != NULL && access(control, F_OK) == 0;
}

static void *next(const char *name) {
    return dlsym(RTLD_NEXT, name);
}

static mode_t mode_of(int flags, va_list arguments) {
    if ((flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE) {
        return (mode_t)va_arg(arguments, int);
    }
    return 0;
}

int open(const char *path, int flags, ...) {
    static int (*real)(const char *, int, ...);
    va_list arguments;
    mode_t mode;
    int fd;
    if (real == NULL) {
        real = next("open");
    }
    va_start(arguments, flags);
    mode = mode_of(flags, arguments);
    va_end(arguments);
    fd = real(path, flags, mode);
    remember(fd, path);
    return fd;
}

int open64(const char *path, int flags, ...) {
    static int (*real)(const char *, int, ...);
    va_list arguments;
    mode_t mode;
    int fd;
    if (real == NULL) {
        real = next("open64");
    }
    va_start(arguments, flags);
    mode = mode_of(flags, arguments);
    va_end(arguments);
    fd = real(path, flags, mode);
    remember(fd, path);
    return fd;
}

int openat(int dir, const char *path, int flags, ...) {
    static int (*real)(int, const char *, int, ...);
    va_list arguments;
    mode_t mode;
    int fd;
    if (real == NULL) {
        real = next("openat");
    }
    va_start(arguments, flags);
    mode = mode_of(flags, arguments);
    va_end(arguments);
    fd = real(dir, path, flags, mode);
    remember(fd, path);
    return fd;
}

int openat64(int dir, const char *path, int flags, ...) {
    static int (*real)(int, const char *, int, ...);
    va_list arguments;
    mode_t mode;
    int fd;
    if (real == NULL) {
        real = next("openat64");
    }
    va_start(arguments, flags);
    mode = mode_of(flags, arguments);
    va_end(arguments);
    fd = real(dir, path, flags, mode);
    remember(fd, path);
    return fd;
}

int close(int fd) {
    static int (*real)(int);
    if (real == NULL) {
        real = next("close");
    }
    if (fd >= 0 && fd < TRACKED_FDS) {
        is_journal_fd[fd] = 0;
    }
    return real(fd);
}

ssize_t write(int fd, const void *buffer, size_t count) {
    static ssize_t (*real)(int, const void *, size_t);
    if (real == NULL) {
        real = next("write");
    }
    if (is_failing(fd)) {
        errno = EIO;
        return -1;
    }
    return real(fd, buffer, count);
}

ssize_t pwrite(int fd, const void *buffer, size_t count, off_t offset) {
    static ssize_t (*real)(int, const void *, size_t, off_t);
    if (real == NULL) {
        real = next("pwrite");
    }
    if (is_failing(fd)) {
        errno = EIO;
        return -1;
    }
    return real(fd, buffer, count, offset);
}

ssize_t pwrite64(int fd, const void *buffer, size_t count, off64_t offset) {
    static ssize_t (*real)(int, const void *, size_t, off64_t);
    if (real == NULL) {
        real = next("pwrite64");
    }
    if (is_failing(fd)) {
        errno = EIO;
        return -1;
    }
    return real(fd, buffer, count, offset);
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) {
        real = next("fsync");
    }
    if (is_failing(fd)) {
        errno = EIO;
        return -1;
    }
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) {
        real = next("fdatasync");
    }
    if (is_failing(fd)) {
        errno = EIO;
        return -1;
    }
    return real(fd);
}
