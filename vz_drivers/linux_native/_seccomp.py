"""The seccomp filter of linux_native Machines, written into the OCI spec's ``linux.seccomp``.

Modelled on Docker's default profile (moby ``profiles/seccomp/default.json``) and its semantics: every system
call not listed fails with EPERM (``SCMP_ACT_ERRNO``); the allowlist is what ordinary programs need; some calls
are allowed only when the Machine holds the capability that makes them meaningful (``CAP_SYS_ADMIN`` is never
granted by linux_native, so ``mount``, ``unshare``, ``setns``, ``bpf``, namespace flags of ``clone`` and the
new mount API stay blocked); ``clone3`` answers ENOSYS so that C libraries fall back to ``clone``, whose
namespace flags the filter can see. Key management (``keyctl``, ``add_key``, ``request_key``), kernel modules,
``kexec``, ``reboot``, ``swapon``, ``userfaultfd``, ``perf_event_open`` and AF_VSOCK sockets are not on the list;
neither are ``ptrace``, ``process_vm_readv``/``writev``, ``kcmp``, ``pidfd_getfd`` and ``process_madvise`` (they
reach into another process, and PID 1 is the guest agent: see ``_DEBUG``).

The result: no user namespace can be created (``unshare -U`` / ``clone(CLONE_NEWUSER)`` fail with EPERM),
whatever the capabilities.
"""

from __future__ import annotations

import platform
from typing import Any

__all__ = ["CLONE_NAMESPACE_FLAGS", "seccomp_profile"]

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
)
EPERM = 1
ENOSYS = 38
AF_VSOCK = 40

# Grouped by purpose; names of other architectures (…32, …64 variants) are ignored by libseccomp where absent.
_FILES = """
access faccessat faccessat2 open openat openat2 creat close close_range read readv pread64 preadv preadv2 write
writev pwrite64 pwritev pwritev2 lseek _llseek stat stat64 lstat lstat64 fstat fstat64 fstatat64 newfstatat statx
statfs statfs64 fstatfs fstatfs64 truncate truncate64 ftruncate ftruncate64 fallocate fadvise64 fadvise64_64
readahead fsync fdatasync sync syncfs sync_file_range copy_file_range sendfile sendfile64 splice tee vmsplice
dup dup2 dup3 fcntl fcntl64 flock ioctl chdir fchdir getcwd mkdir mkdirat mknod mknodat rmdir rename renameat
renameat2 link linkat symlink symlinkat unlink unlinkat readlink readlinkat chmod fchmod fchmodat chown chown32
fchown fchown32 fchownat lchown lchown32 umask utime utimes utimensat utimensat_time64 futimesat getdents
getdents64 getxattr lgetxattr fgetxattr listxattr llistxattr flistxattr setxattr lsetxattr fsetxattr removexattr
lremovexattr fremovexattr name_to_handle_at inotify_init inotify_init1 inotify_add_watch inotify_rm_watch
fanotify_mark memfd_create memfd_secret pipe pipe2 io_setup io_destroy io_submit io_cancel io_getevents
io_pgetevents io_pgetevents_time64 io_uring_setup io_uring_enter io_uring_register
"""
_MEMORY = """
brk mmap mmap2 munmap mremap mprotect madvise mincore msync mlock mlock2 mlockall munlock munlockall membarrier
remap_file_pages pkey_alloc pkey_free pkey_mprotect process_mrelease
"""
_PROCESSES = """
execve execveat exit exit_group fork vfork wait4 waitid waitpid kill tkill tgkill pidfd_open pidfd_send_signal
getpid getppid gettid getpgid setpgid getpgrp getsid setsid getuid getuid32 geteuid geteuid32 getgid getgid32
getegid getegid32 getresuid getresuid32 getresgid getresgid32 getgroups getgroups32 setuid setuid32 setgid
setgid32 setreuid setreuid32 setregid setregid32 setresuid setresuid32 setresgid setresgid32 setfsuid setfsuid32
setfsgid setfsgid32 setgroups setgroups32 capget capset prctl arch_prctl modify_ldt set_thread_area
get_thread_area set_tid_address set_robust_list get_robust_list rseq seccomp getrlimit ugetrlimit setrlimit
prlimit64 getrusage getpriority setpriority ioprio_get ioprio_set sched_yield sched_getaffinity sched_setaffinity
sched_getattr sched_setattr sched_getparam sched_setparam sched_getscheduler sched_setscheduler
sched_get_priority_max sched_get_priority_min sched_rr_get_interval sched_rr_get_interval_time64 getcpu uname
sysinfo times landlock_create_ruleset landlock_add_rule landlock_restrict_self
"""
_SIGNALS_TIME = """
rt_sigaction rt_sigprocmask rt_sigpending rt_sigqueueinfo rt_tgsigqueueinfo rt_sigreturn rt_sigsuspend
rt_sigtimedwait rt_sigtimedwait_time64 sigaltstack sigreturn sigprocmask signalfd signalfd4 pause alarm
restart_syscall nanosleep clock_nanosleep clock_nanosleep_time64 clock_gettime clock_gettime64 clock_getres
clock_getres_time64 clock_adjtime clock_adjtime64 adjtimex gettimeofday time getitimer setitimer timer_create
timer_delete timer_getoverrun timer_gettime timer_gettime64 timer_settime timer_settime64 timerfd_create
timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64 futex futex_time64 futex_waitv eventfd
eventfd2 getrandom
"""
_POLL_IPC_NET = """
poll ppoll ppoll_time64 select _newselect pselect6 pselect6_time64 epoll_create epoll_create1 epoll_ctl
epoll_ctl_old epoll_wait epoll_wait_old epoll_pwait epoll_pwait2 socketpair socketcall bind connect listen
accept accept4 getsockname getpeername getsockopt setsockopt shutdown send sendto sendmsg sendmmsg recv recvfrom
recvmsg recvmmsg recvmmsg_time64 ipc msgget msgsnd msgrcv msgctl semget semop semtimedop semtimedop_time64
semctl shmget shmat shmdt shmctl mq_open mq_unlink mq_timedsend mq_timedsend_time64 mq_timedreceive
mq_timedreceive_time64 mq_notify mq_getsetattr
"""
# Not allowed, in both profiles: ptrace, process_vm_readv and process_vm_writev. Docker's default profile allows
# them on Linux >= 4.8 (seccomp can no longer be bypassed by a tracer changing a call) and leaves the target's
# protection to the kernel's ptrace access checks. A Machine's PID 1 is the vz guest agent, which holds the
# boot's identity key and the host's channel: a Machine's root that could trace it could replace it (as an
# attack on an earlier version did), so the filter refuses the calls outright and the kernel's checks (the
# agent is not dumpable, no Machine holds CAP_SYS_PTRACE) are the second wall, not the only one. gVisor, the
# other reference, implements ptrace inside its own kernel and never hands it to the host. A filter on the pid
# argument cannot protect the agent (every thread of it has its own id), so debuggers need
# `security_opt: ["seccomp=unconfined"]` (developer profile), where the kernel's checks still hold.
_DEBUG = "ptrace process_vm_readv process_vm_writev"

_BY_CAPABILITY: dict[str, str] = {
    "CAP_SYS_ADMIN": (
        "bpf clone clone3 fanotify_init fsconfig fsmount fsopen fspick lookup_dcookie mount mount_setattr "
        "move_mount open_tree perf_event_open quotactl quotactl_fd setdomainname sethostname setns syslog umount "
        "umount2 unshare"
    ),
    "CAP_DAC_READ_SEARCH": "open_by_handle_at",
    "CAP_SYS_BOOT": "reboot",
    "CAP_SYS_CHROOT": "chroot",
    "CAP_SYS_MODULE": "delete_module init_module finit_module",
    "CAP_SYS_PACCT": "acct",
    # As in Docker's profile; linux_native refuses cap_add CAP_SYS_PTRACE (it would defeat the agent's protection).
    "CAP_SYS_PTRACE": "kcmp pidfd_getfd process_madvise " + _DEBUG,
    "CAP_SYS_RAWIO": "iopl ioperm",
    "CAP_SYS_TIME": "settimeofday stime clock_settime clock_settime64",
    "CAP_SYS_TTY_CONFIG": "vhangup",
    "CAP_SYS_NICE": "get_mempolicy mbind set_mempolicy set_mempolicy_home_node",
    "CAP_SYSLOG": "syslog",
    "CAP_BPF": "bpf",
    "CAP_PERFMON": "perf_event_open",
}

_PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
"""PER_LINUX, UNAME26, ADDR_NO_RANDOMIZE and their combination, and the query value."""

_ARCHES = {
    "x86_64": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    "aarch64": ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
}


def _names(*groups: str) -> list[str]:
    return sorted({name for group in groups for name in group.split()})


def seccomp_profile(capabilities: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The OCI ``linux.seccomp`` object for a Machine holding ``capabilities`` (bounding set)."""
    caps = set(capabilities)
    allowed = set(_names(_FILES, _MEMORY, _PROCESSES, _SIGNALS_TIME, _POLL_IPC_NET))
    for cap, names in _BY_CAPABILITY.items():
        if cap in caps:
            allowed.update(names.split())
    rules: list[dict[str, Any]] = [{"names": sorted(allowed), "action": "SCMP_ACT_ALLOW"}]
    rules.append(
        {
            "names": ["socket"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_NE"}],
        }
    )
    for value in _PERSONALITIES:
        rules.append(
            {
                "names": ["personality"],
                "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": value, "op": "SCMP_CMP_EQ"}],
            }
        )
    if "CAP_SYS_ADMIN" not in caps:
        # clone without namespace flags only; clone3 hides its flags in memory, so it reports "not implemented".
        rules.append(
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
            }
        )
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    profile: dict[str, Any] = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": EPERM, "syscalls": rules}
    arches = _ARCHES.get(platform.machine().lower())
    if arches:
        profile["architectures"] = arches
    return profile
