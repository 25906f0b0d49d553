"""The seccomp filter a sandbox runs under: system calls model code never needs, refused.

bwrap loads it (``--seccomp FD``) just before it runs the launcher, so it binds the
command and everything it starts, whether the worker is root or not. Refused with EPERM:

* new namespaces (``unshare``, ``setns``, ``clone`` with a namespace flag, and ``clone3``,
  whose flags a filter cannot read: it answers ENOSYS, so C libraries fall back to
  ``clone``): no nested user namespace, so no capabilities regained inside;
* mounts, ``pivot_root``, ``chroot``; tracing other processes and reading their memory;
* kernel facilities with a history of privilege escalations and no use in a test run:
  BPF, perf events, userfaultfd, the key rings, module loading, ``kexec``,
  ``open_by_handle_at``, ``fanotify``, ``iopl``/``ioperm``, swap, reboot, the clock,
  ``syslog``, ``acct``, ``quotactl``;
* any system call of another ABI (x32 on x86-64), whose numbers the list does not cover.

The program is classic BPF built here (no libseccomp needed); a machine of another
architecture gets no filter and ``seccomp_program`` says so (None).
"""

from __future__ import annotations

import errno
import os
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_W_ABS = 0x20
_JEQ_K, _JSET_K, _JGE_K = 0x15, 0x45, 0x35
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
#: CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME.
_NAMESPACE_FLAGS = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
    | 0x00000080
)  # fmt: skip
_X32_SYSCALL_BIT = 0x40000000

#: Refused system calls by name, and their numbers per architecture.
_REFUSED = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "ptrace",
    "process_vm_readv", "process_vm_writev", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "bpf", "perf_event_open", "userfaultfd", "keyctl",
    "add_key", "request_key", "open_by_handle_at", "name_to_handle_at", "fanotify_init",
    "swapon", "swapoff", "reboot", "syslog", "acct", "quotactl", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
    "iopl", "ioperm", "fsopen", "fsmount", "move_mount", "open_tree", "mount_setattr",
)  # fmt: skip
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "keyctl": 250, "add_key": 248, "request_key": 249, "open_by_handle_at": 304,
        "name_to_handle_at": 303, "fanotify_init": 300, "swapon": 167, "swapoff": 168,
        "reboot": 169, "syslog": 103, "acct": 163, "quotactl": 179, "settimeofday": 164,
        "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "sethostname": 170,
        "setdomainname": 171, "iopl": 172, "ioperm": 173, "fsopen": 430, "fsmount": 432,
        "move_mount": 429, "open_tree": 428, "mount_setattr": 442,
        "clone": 56, "clone3": 435,
    }),
    "aarch64": (0xC00000B7, {
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
        "chroot": 51, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "keyctl": 219, "add_key": 217, "request_key": 218, "open_by_handle_at": 265,
        "name_to_handle_at": 264, "fanotify_init": 262, "swapon": 224, "swapoff": 225,
        "reboot": 142, "syslog": 116, "acct": 89, "quotactl": 60, "settimeofday": 170,
        "clock_settime": 112, "clock_adjtime": 266, "adjtimex": 171, "sethostname": 161,
        "setdomainname": 162, "fsopen": 430, "fsmount": 432, "move_mount": 429,
        "open_tree": 428, "mount_setattr": 442, "clone": 220, "clone3": 435,
    }),
}  # fmt: skip


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The filter for this machine's architecture as bwrap reads it (None: unsupported)."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, numbers = arch
    refused = [numbers[name] for name in _REFUSED if name in numbers]
    deny = _RET_K, _ERRNO | errno.EPERM
    # Layout: arch check, ABI check, one jump per refused call, clone/clone3, then allow;
    # the two return blocks at the end (jumps count the instructions they skip).
    body: list[tuple[int, int, int, int]] = []
    body.append((_LD_W_ABS, _ARCH, 0, 0))
    body.append((_JEQ_K, audit_arch, 1, 0))
    body.append((*deny, 0, 0))  # another architecture's calls: refused
    body.append((_LD_W_ABS, _NR, 0, 0))
    jumps_to_deny = len(refused) + 1  # each refused call, and the ABI check
    body.append((_JGE_K, _X32_SYSCALL_BIT, 0, 0))
    for number in refused:
        body.append((_JEQ_K, number, 0, 0))
    body.append((_JEQ_K, numbers["clone3"], 0, 0))  # to ENOSYS
    body.append((_JEQ_K, numbers["clone"], 0, 0))  # to the flags check
    body.append((_RET_K, _ALLOW, 0, 0))
    flags_check = len(body)
    body.append((_LD_W_ABS, _ARG0, 0, 0))
    body.append((_JSET_K, _NAMESPACE_FLAGS, 0, 0))
    body.append((_RET_K, _ALLOW, 0, 0))
    enosys = len(body)
    body.append((_RET_K, _ERRNO | errno.ENOSYS, 0, 0))
    refuse = len(body)
    body.append((*deny, 0, 0))
    program = []
    first_jump = 4
    for index, (code, k, jt, jf) in enumerate(body):
        if first_jump <= index < first_jump + jumps_to_deny:
            jt = refuse - index - 1
        elif code == _JEQ_K and k == numbers["clone3"] and index > first_jump:
            jt = enosys - index - 1
        elif code == _JEQ_K and k == numbers["clone"] and index > first_jump:
            jt = flags_check - index - 1
        elif code == _JSET_K:
            jt = refuse - index - 1
        program.append(_op(code, k, jt, jf))
    return b"".join(program)


def seccomp_fd(machine: str | None = None) -> int | None:
    """A readable descriptor holding the filter (the caller closes it), or None."""
    program = seccomp_program(machine)
    if program is None:
        return None
    read_end, write_end = os.pipe()
    os.write(write_end, program)
    os.close(write_end)
    return read_end
