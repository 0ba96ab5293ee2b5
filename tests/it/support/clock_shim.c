/* A wall clock that jumps: preloaded into a process, it moves every reading of the wall clock
 * (clock_gettime of CLOCK_REALTIME and its coarse form, gettimeofday, time) on by the seconds
 * in RUNJOURNAL_TEST_CLOCK_OFFSET_S. Monotonic clocks and /proc/uptime are left alone, as a
 * clock stepped by a bad RTC or a resumed VM leaves them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long offset_seconds(void) {
    const char *text = getenv("RUNJOURNAL_TEST_CLOCK_OFFSET_S");
    return text ? strtol(text, NULL, 10) : 0;
}

int clock_gettime(clockid_t clock, struct timespec *now) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) {
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    }
    int answer = real(clock, now);
    if (answer == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        now->tv_sec += offset_seconds();
    }
    return answer;
}

int gettimeofday(struct timeval *restrict now, void *restrict zone) {
    static int (*real)(struct timeval *restrict, void *restrict);
    if (!real) {
        real = (int (*)(struct timeval *restrict, void *restrict))dlsym(RTLD_NEXT, "gettimeofday");
    }
    int answer = real(now, zone);
    if (answer == 0) {
        now->tv_sec += offset_seconds();
    }
    return answer;
}

time_t time(time_t *out) {
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
        return (time_t)-1;
    }
    if (out) {
        *out = now.tv_sec;
    }
    return now.tv_sec;
}
