/* Tries, from inside a Machine, every way the ptrace access mode guards to reach into another process, on the
 * Machine's PID 1 (the vz guest agent). One line per attempt: "<what> ok" or "<what> <errno name>". A successful
 * attach is detached at once so that the agent goes on serving (the test then reports it, not a hang). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#ifndef SYS_kcmp
#define SYS_kcmp 312
#endif
#define KCMP_FILE 0

static const char *name(int err) {
    switch (err) {
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case EFAULT: return "EFAULT";
    case ESRCH: return "ESRCH";
    case EIO: return "EIO";
    case ENOSYS: return "ENOSYS";
    case EINVAL: return "EINVAL";
    case EBADF: return "EBADF";
    default: return strerror(err);
    }
}

static void report(const char *what, long rc, int err) {
    if (rc >= 0)
        printf("%s ok\n", what);
    else
        printf("%s %s\n", what, name(err));
    fflush(stdout);
}

static void attach(const char *what, long request) {
    long rc = ptrace(request, 1, 0, 0);
    int err = errno;
    report(what, rc, err);
    if (rc == 0) {
        if (request == PTRACE_ATTACH) waitpid(1, NULL, __WALL);
        ptrace(PTRACE_DETACH, 1, 0, 0);
    }
}

int main(void) {
    attach("ptrace_attach", PTRACE_ATTACH);
    attach("ptrace_seize", PTRACE_SEIZE);

    /* A static Go binary is mapped at 0x400000 (not position independent). */
    char buf[16];
    struct iovec local = {buf, sizeof buf}, remote = {(void *)0x400000, sizeof buf};
    long rc = syscall(SYS_process_vm_readv, 1, &local, 1, &remote, 1, 0);
    report("process_vm_readv", rc, errno);
    struct iovec one = {buf, 1}, there = {(void *)0x400000, 1};
    rc = syscall(SYS_process_vm_writev, 1, &one, 1, &there, 1, 0);
    report("process_vm_writev", rc, errno);

    int fd = open("/proc/1/mem", O_RDWR);
    report("proc_mem_write", fd, errno);
    if (fd >= 0) close(fd);
    fd = open("/proc/1/environ", O_RDONLY);
    report("proc_environ", fd, errno);
    if (fd >= 0) close(fd);
    /* Re-open what the agent holds open (its main log, pipes, /dev/null; sockets answer ENXIO either way): "ok"
     * when any of them opens, else a refusal if one was refused, else the first other error. */
    int opened = 0, refused = 0, other = 0;
    for (int target = 0; target < 64 && !opened; target++) {
        char path[32];
        snprintf(path, sizeof path, "/proc/1/fd/%d", target);
        fd = open(path, O_RDONLY | O_NONBLOCK);
        if (fd >= 0) {
            opened = 1;
            close(fd);
        } else if (errno == EACCES || errno == EPERM) {
            refused = refused ? refused : errno;
        } else if (errno != ENOENT && errno != ENXIO) {
            other = other ? other : errno;
        }
    }
    report("proc_fd", opened ? 0 : -1, refused ? refused : (other ? other : ENOENT));

    long pidfd = syscall(SYS_pidfd_open, 1, 0);
    report("pidfd_open", pidfd, errno);
    if (pidfd >= 0) {
        for (int target = 0; target < 8; target++) { /* one of them is the agent's listening socket */
            long got = syscall(SYS_pidfd_getfd, (int)pidfd, target, 0);
            int err = errno;
            if (got >= 0 || target == 7) {
                report("pidfd_getfd", got, err);
                break;
            }
        }
    }
    rc = syscall(SYS_kcmp, 1, getpid(), KCMP_FILE, 0, 0);
    report("kcmp", rc, errno);
    return 0;
}
