/* LD_PRELOAD shim for the ingest bench: makes every fsync/fdatasync take at least
 * SLOW_FSYNC_US microseconds longer, to reproduce a disk whose flush costs milliseconds (the
 * reference box, a spinning disk, a busy SSD) on a machine whose virtual disk flushes in
 * ~0.5 ms. Only the bench loads it; deadletter itself never does. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

static useconds_t delay_us(void) {
    const char *v = getenv("SLOW_FSYNC_US");
    return v ? (useconds_t)atoi(v) : 0;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    usleep(delay_us());
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    usleep(delay_us());
    return real(fd);
}
