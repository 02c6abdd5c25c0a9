//! berth's `runtime/default` seccomp profile: allow by default, deny a list of dangerous syscalls.
//!
//! Why a denylist rather than Docker's allowlist: an allowlist has to name every syscall any
//! workload may use, on every architecture, and gets new syscalls wrong in both directions (glibc
//! starts using one the list lacks; the list names one the runtime's libseccomp does not know).
//! A denylist is short, stays correct as kernels grow, and blocks what Docker's profile is known
//! for blocking — kernel modules, kexec, reboot, swap, the clock, the kernel keyring, raw I/O
//! ports, io_uring, and, without CAP_SYS_ADMIN, mounting and creating namespaces. Its weakness is
//! that a new dangerous syscall is allowed until it is added here.
//!
//! As in Docker's profile, syscalls a capability grants are denied only when the container lacks
//! that capability. Denied calls fail with EPERM; `clone3` fails with ENOSYS so that libc falls
//! back to `clone`, whose namespace flags can be filtered.

use oci_spec::runtime::{
    Arch, Capabilities, Capability, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompOperator, LinuxSyscall,
};

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

/// Denied whatever the capabilities.
const ALWAYS: &[&str] = &[
    "kexec_load",
    "kexec_file_load",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "vm86",
    "vm86old",
    "add_key",
    "request_key",
    "keyctl",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
];

/// Denied unless the container holds one of the capabilities.
const BY_CAPABILITY: &[(&[Capability], &[&str])] = &[
    (
        &[Capability::SysAdmin],
        &[
            "mount",
            "umount",
            "umount2",
            "pivot_root",
            "unshare",
            "setns",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "move_mount",
            "open_tree",
            "mount_setattr",
            "quotactl",
            "quotactl_fd",
            "lookup_dcookie",
            "fanotify_init",
            "swapon",
            "swapoff",
            "sethostname",
            "setdomainname",
        ],
    ),
    (&[Capability::SysAdmin, Capability::Bpf], &["bpf"]),
    (&[Capability::SysAdmin, Capability::Perfmon], &["perf_event_open"]),
    (&[Capability::SysModule], &["init_module", "finit_module", "delete_module"]),
    (&[Capability::SysBoot], &["reboot"]),
    (
        &[Capability::SysTime],
        &["settimeofday", "stime", "clock_settime", "clock_settime64", "clock_adjtime", "clock_adjtime64"],
    ),
    (&[Capability::SysPtrace], &["kcmp", "userfaultfd", "pidfd_getfd"]),
    (&[Capability::SysPacct], &["acct"]),
    (&[Capability::SysRawio], &["iopl", "ioperm"]),
    (&[Capability::Syslog], &["syslog"]),
    (&[Capability::SysNice], &["mbind", "set_mempolicy", "move_pages", "get_mempolicy"]),
    (&[Capability::DacReadSearch], &["open_by_handle_at"]),
];

/// `clone` flags that create namespaces (CLONE_NEWNS … CLONE_NEWNET).
const CLONE_NAMESPACE_FLAGS: &[u64] =
    &[0x0002_0000, 0x0200_0000, 0x0400_0000, 0x0800_0000, 0x1000_0000, 0x2000_0000, 0x4000_0000];

/// The profile for a container holding `caps` (its bounding set).
pub fn default_profile(caps: &Capabilities) -> LinuxSeccomp {
    let has_any = |wanted: &[Capability]| wanted.iter().any(|c| caps.contains(c));
    let mut denied: Vec<String> = ALWAYS.iter().map(|s| s.to_string()).collect();
    for (wanted, names) in BY_CAPABILITY {
        if !has_any(wanted) {
            denied.extend(names.iter().map(|s| s.to_string()));
        }
    }
    let mut syscalls = vec![syscall(denied, EPERM, None)];
    if !caps.contains(&Capability::SysAdmin) {
        syscalls.push(syscall(vec!["clone3".into()], ENOSYS, None));
        // One rule per flag: rules on one syscall are alternatives, and each matches when
        // (flags & FLAG) == FLAG. The flags are clone's first argument on x86 and arm.
        for &flag in CLONE_NAMESPACE_FLAGS {
            let arg = LinuxSeccompArgBuilder::default()
                .index(0usize)
                .value(flag)
                .value_two(flag)
                .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
                .build()
                .expect("every field of a seccomp argument is set");
            syscalls.push(syscall(vec!["clone".into()], EPERM, Some(vec![arg])));
        }
    }
    let mut profile = LinuxSeccomp::default();
    profile
        .set_default_action(LinuxSeccompAction::ScmpActAllow)
        .set_architectures(Some(architectures()))
        .set_syscalls(Some(syscalls));
    profile
}

fn syscall(names: Vec<String>, errno: u32, args: Option<Vec<LinuxSeccompArg>>) -> LinuxSyscall {
    let mut s = LinuxSyscall::default();
    s.set_names(names).set_action(LinuxSeccompAction::ScmpActErrno).set_errno_ret(Some(errno)).set_args(args);
    s
}

/// The host's architecture and the compat ones its kernel runs, so that 32-bit calls are filtered
/// too.
fn architectures() -> Vec<Arch> {
    if cfg!(target_arch = "x86_64") {
        vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
    } else if cfg!(target_arch = "aarch64") {
        vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm]
    } else {
        vec![Arch::ScmpArchNative]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(p: &LinuxSeccomp) -> Vec<String> {
        p.syscalls().as_ref().unwrap().iter().filter(|s| s.args().is_none()).flat_map(|s| s.names().clone()).collect()
    }

    #[test]
    fn the_default_profile_allows_by_default_and_denies_the_dangerous_syscalls() {
        let p = default_profile(&Capabilities::new());
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActAllow);
        let denied = denied(&p);
        for name in
            ["kexec_load", "open_by_handle_at", "init_module", "finit_module", "delete_module", "iopl", "ioperm"]
        {
            assert!(denied.iter().any(|d| d == name), "{name} is not denied");
        }
        for name in ["swapon", "swapoff", "syslog", "reboot", "mount", "umount2", "unshare", "clone3"] {
            assert!(denied.iter().any(|d| d == name), "{name} is not denied");
        }
        assert!(!denied.iter().any(|d| d == "read" || d == "clone" || d == "execve"));
    }

    #[test]
    fn a_capability_reallows_the_syscalls_it_grants() {
        let caps: Capabilities = [Capability::SysAdmin, Capability::SysBoot].into_iter().collect();
        let p = default_profile(&caps);
        let denied = denied(&p);
        for name in ["mount", "umount2", "unshare", "setns", "reboot", "clone3", "bpf"] {
            assert!(!denied.iter().any(|d| d == name), "{name} is still denied");
        }
        assert!(denied.iter().any(|d| d == "init_module"));
        assert!(!p.syscalls().as_ref().unwrap().iter().any(|s| s.names() == &["clone"]));
    }

    #[test]
    fn clone_is_denied_only_with_namespace_flags() {
        let p = default_profile(&Capabilities::new());
        let clone_rules: Vec<_> = p.syscalls().as_ref().unwrap().iter().filter(|s| s.names() == &["clone"]).collect();
        assert_eq!(clone_rules.len(), 7);
        let net = clone_rules.iter().find(|s| s.args().as_ref().unwrap()[0].value() == 0x4000_0000).unwrap();
        let arg = net.args().as_ref().unwrap()[0];
        assert_eq!((arg.op(), arg.value_two()), (LinuxSeccompOperator::ScmpCmpMaskedEq, Some(0x4000_0000)));
    }
}
