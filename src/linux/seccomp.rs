//! The sandbox's seccomp program. Pure: the program is data, built here and
//! checked by a small classic-BPF interpreter in the tests; `sys` installs
//! it, last of the confinement steps.
//!
//! What it decides, in order:
//! 1. a call of a foreign ABI (an i386 process on x86_64, an arm32 one on
//!    arm64) or of x32 gets ENOSYS: syscall numbers mean other things there,
//!    so every check below would be wrong for them;
//! 2. `openat2` (its mode is in memory, out of the filter's sight) and
//!    `io_uring_setup` (io_uring's operations bypass seccomp) get ENOSYS, so
//!    programs fall back to the calls checked here; `userfaultfd` gets EPERM
//!    (page faults a sandboxed program serves itself could stall the
//!    supervisor reading its memory);
//! 3. a set-user-ID or set-group-ID bit in the mode of `chmod`, `fchmod`,
//!    `fchmodat`, `fchmodat2`, `creat`, `mknod`, `mknodat`, or of an
//!    `open`/`openat` that creates, gets EPERM: a file the agent marks
//!    setuid in the workspace would give whoever runs it later the file
//!    owner's rights (root's, for an agent running as root). The mode is an
//!    integer argument, so the check is exact: nothing to race;
//! 4. with a supervisor (name-prefix grants, see `supervise`), every call
//!    that creates, replaces or removes a name goes to it: an open with
//!    O_CREAT or O_TRUNC (whatever else its flags say: a grant must not hold
//!    for one program's choice of flags only), `creat`, `mkdir`, `rmdir`,
//!    `unlink*`, `rename*`, `link*`, `symlink*`, `utimensat` on a path.
//!    Reads and writes through an open descriptor never are: every call
//!    handed over costs a round trip, whatever file it names;
//! 5. everything else is allowed (the sandbox's mounts and Landlock still
//!    decide it).

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!(
    "zcode-acp's Linux sandbox knows the syscall numbers of x86_64 and aarch64 only; \
     its seccomp filter (src/linux/seccomp.rs) needs this architecture's table first"
);

/// `struct sock_filter` (classic BPF), as the kernel reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

// Classic BPF opcodes used here.
const LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20)
const JMP_JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
const JMP_JGE_K: u16 = 0x05 | 0x30; // BPF_JMP | BPF_JGE | BPF_K
const JMP_JSET_K: u16 = 0x05 | 0x40; // BPF_JMP | BPF_JSET | BPF_K
const JMP_JA: u16 = 0x05; // BPF_JMP | BPF_JA
const RET_K: u16 = 0x06; // BPF_RET | BPF_K

pub const RET_ALLOW: u32 = 0x7fff_0000;
pub const RET_USER_NOTIF: u32 = 0x7fc0_0000;
const RET_ERRNO: u32 = 0x0005_0000;
pub const RET_ENOSYS: u32 = RET_ERRNO | libc::ENOSYS as u32;
pub const RET_EPERM: u32 = RET_ERRNO | libc::EPERM as u32;

// Offsets into `struct seccomp_data`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// The low 32 bits of argument `i` (little-endian; both arches here are).
const fn arg_lo(i: u32) -> u32 {
    16 + 8 * i
}
const fn arg_hi(i: u32) -> u32 {
    16 + 8 * i + 4
}

/// An open that makes or empties a file: either bit set.
pub const CREATE_OR_TRUNCATE: u32 = (libc::O_CREAT | libc::O_TRUNC) as u32;
/// Flags under which an open's mode argument means something.
const MODE_USED: u32 = (libc::O_CREAT | (libc::O_TMPFILE & !libc::O_DIRECTORY)) as u32;
/// The bits no file made in the sandbox may carry.
pub const SET_ID: u32 = libc::S_ISUID | libc::S_ISGID;

/// The native ABI's audit architecture and syscall numbers.
pub struct Abi {
    pub arch: u32,
    /// Numbers at or above this are x32 calls (x86_64 only).
    pub x32_bit: Option<u32>,
    /// `(nr, flags argument, mode argument)` of the opens.
    pub opens: &'static [(u32, u32, u32)],
    /// `(nr, mode argument)` of the calls whose mode is always checked.
    pub modes: &'static [(u32, u32)],
    /// `creat`, where there is one: its mode is checked, then it is handed
    /// over (it always creates).
    pub creat: Option<u32>,
    /// Refused with ENOSYS.
    pub unavailable: &'static [u32],
    /// Refused with EPERM.
    pub refused: &'static [u32],
    /// Handed to the supervisor, when there is one.
    pub supervised: &'static [u32],
    /// `utimensat`: handed over only when its path argument is not NULL.
    pub utimensat: u32,
}

/// `fchmodat2` (Linux 6.6), the same number on every arch here; not in
/// every libc crate yet.
pub const SYS_FCHMODAT2: u32 = 452;
/// `renameat` in the generic table (arm64); libc leaves it out there.
#[cfg(target_arch = "aarch64")]
pub const SYS_RENAMEAT_GENERIC: u32 = 38;

#[cfg(target_arch = "x86_64")]
pub const NATIVE: Abi = Abi {
    arch: 0xC000_003E, // AUDIT_ARCH_X86_64
    x32_bit: Some(0x4000_0000),
    opens: &[
        (libc::SYS_openat as u32, 2, 3),
        (libc::SYS_open as u32, 1, 2),
    ],
    modes: &[
        (libc::SYS_chmod as u32, 1),
        (libc::SYS_fchmod as u32, 1),
        (libc::SYS_fchmodat as u32, 2),
        (SYS_FCHMODAT2, 2),
        (libc::SYS_mknod as u32, 1),
        (libc::SYS_mknodat as u32, 2),
    ],
    creat: Some(libc::SYS_creat as u32),
    unavailable: &[libc::SYS_openat2 as u32, libc::SYS_io_uring_setup as u32],
    refused: &[libc::SYS_userfaultfd as u32],
    supervised: &[
        libc::SYS_mkdir as u32,
        libc::SYS_mkdirat as u32,
        libc::SYS_rmdir as u32,
        libc::SYS_unlink as u32,
        libc::SYS_unlinkat as u32,
        libc::SYS_rename as u32,
        libc::SYS_renameat as u32,
        libc::SYS_renameat2 as u32,
        libc::SYS_link as u32,
        libc::SYS_linkat as u32,
        libc::SYS_symlink as u32,
        libc::SYS_symlinkat as u32,
    ],
    utimensat: libc::SYS_utimensat as u32,
};

#[cfg(target_arch = "aarch64")]
pub const NATIVE: Abi = Abi {
    arch: 0xC000_00B7, // AUDIT_ARCH_AARCH64
    x32_bit: None,
    opens: &[(libc::SYS_openat as u32, 2, 3)],
    modes: &[
        (libc::SYS_fchmod as u32, 1),
        (libc::SYS_fchmodat as u32, 2),
        (SYS_FCHMODAT2, 2),
        (libc::SYS_mknodat as u32, 2),
    ],
    creat: None,
    unavailable: &[libc::SYS_openat2 as u32, libc::SYS_io_uring_setup as u32],
    refused: &[libc::SYS_userfaultfd as u32],
    supervised: &[
        libc::SYS_mkdirat as u32,
        libc::SYS_unlinkat as u32,
        SYS_RENAMEAT_GENERIC,
        libc::SYS_renameat2 as u32,
        libc::SYS_linkat as u32,
        libc::SYS_symlinkat as u32,
    ],
    utimensat: libc::SYS_utimensat as u32,
};

/// Where a jump goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    Next,
    Allow,
    Notify,
    Enosys,
    Eperm,
    Label(usize),
}

/// A tiny assembler: jumps name their targets, resolved at the end.
#[derive(Default)]
struct Asm {
    code: Vec<(Insn, Option<(Target, Target)>)>,
    /// Where each label was bound.
    labels: Vec<Option<usize>>,
}

impl Asm {
    fn insn(&mut self, code: u16, k: u32) {
        self.code.push((
            Insn {
                code,
                jt: 0,
                jf: 0,
                k,
            },
            None,
        ));
    }
    fn ld(&mut self, off: u32) {
        self.insn(LD_W_ABS, off);
    }
    fn jump(&mut self, code: u16, k: u32, jt: Target, jf: Target) {
        self.code.push((
            Insn {
                code,
                jt: 0,
                jf: 0,
                k,
            },
            Some((jt, jf)),
        ));
    }
    /// An unconditional jump (both branches to `to`).
    fn goto(&mut self, to: Target) {
        self.code.push((
            Insn {
                code: JMP_JA,
                jt: 0,
                jf: 0,
                k: 0,
            },
            Some((to, to)),
        ));
    }
    fn label(&mut self) -> Target {
        self.labels.push(None);
        Target::Label(self.labels.len() - 1)
    }
    fn bind(&mut self, l: Target) {
        if let Target::Label(i) = l {
            self.labels[i] = Some(self.code.len());
        }
    }
    fn finish(self) -> Vec<Insn> {
        // The exits come last, in a fixed order.
        let n = self.code.len();
        let (allow, notify, enosys, eperm) = (n, n + 1, n + 2, n + 3);
        let mut out = Vec::with_capacity(n + 4);
        for (i, (mut insn, jumps)) in self.code.into_iter().enumerate() {
            if let Some((jt, jf)) = jumps {
                let resolve = |t: Target| -> usize {
                    let to = match t {
                        Target::Next => i + 1,
                        Target::Allow => allow,
                        Target::Notify => notify,
                        Target::Enosys => enosys,
                        Target::Eperm => eperm,
                        Target::Label(l) => self.labels[l].expect("an unbound label"),
                    };
                    assert!(to > i, "seccomp jumps go forward only");
                    to - i - 1
                };
                if insn.code == JMP_JA {
                    insn.k = resolve(jt) as u32;
                } else {
                    insn.jt = u8::try_from(resolve(jt)).expect("a jump longer than 255");
                    insn.jf = u8::try_from(resolve(jf)).expect("a jump longer than 255");
                }
            }
            out.push(insn);
        }
        for k in [RET_ALLOW, RET_USER_NOTIF, RET_ENOSYS, RET_EPERM] {
            out.push(Insn {
                code: RET_K,
                jt: 0,
                jf: 0,
                k,
            });
        }
        out
    }
}

/// The program for `abi`; `supervise`: whether the supervisor's calls are
/// handed over (else they are allowed, and the kernel decides them).
pub fn program(abi: &Abi, supervise: bool) -> Vec<Insn> {
    let mut a = Asm::default();
    a.ld(OFF_ARCH);
    a.jump(JMP_JEQ_K, abi.arch, Target::Next, Target::Enosys);
    a.ld(OFF_NR);
    if let Some(bit) = abi.x32_bit {
        a.jump(JMP_JGE_K, bit, Target::Enosys, Target::Next);
    }
    for &nr in abi.unavailable {
        a.jump(JMP_JEQ_K, nr, Target::Enosys, Target::Next);
    }
    for &nr in abi.refused {
        a.jump(JMP_JEQ_K, nr, Target::Eperm, Target::Next);
    }
    // Dispatch to the checks placed after the list.
    let opens: Vec<_> = abi.opens.iter().map(|o| (*o, a.label())).collect();
    for &((nr, _, _), l) in &opens {
        a.jump(JMP_JEQ_K, nr, l, Target::Next);
    }
    let modes: Vec<_> = abi.modes.iter().map(|m| (*m, a.label())).collect();
    for &((nr, _), l) in &modes {
        a.jump(JMP_JEQ_K, nr, l, Target::Next);
    }
    let creat = abi.creat.map(|nr| (nr, a.label()));
    if let Some((nr, l)) = creat {
        a.jump(JMP_JEQ_K, nr, l, Target::Next);
    }
    let utimensat = a.label();
    if supervise {
        for &nr in abi.supervised {
            a.jump(JMP_JEQ_K, nr, Target::Notify, Target::Next);
        }
        a.jump(JMP_JEQ_K, abi.utimensat, utimensat, Target::Next);
    }
    a.goto(Target::Allow);

    // What a call that passed its mode check becomes.
    let checked = if supervise {
        Target::Notify
    } else {
        Target::Allow
    };
    for ((_, flags, mode), l) in opens {
        a.bind(l);
        let makes = if supervise { a.label() } else { Target::Allow };
        // The mode means something only when the open creates.
        a.ld(arg_lo(flags));
        a.jump(JMP_JSET_K, MODE_USED, Target::Next, makes);
        a.ld(arg_lo(mode));
        a.jump(JMP_JSET_K, SET_ID, Target::Eperm, makes);
        if supervise {
            a.bind(makes);
            a.ld(arg_lo(flags));
            a.jump(
                JMP_JSET_K,
                CREATE_OR_TRUNCATE,
                Target::Notify,
                Target::Allow,
            );
        }
    }
    for ((_, mode), l) in modes {
        a.bind(l);
        a.ld(arg_lo(mode));
        a.jump(JMP_JSET_K, SET_ID, Target::Eperm, Target::Allow);
    }
    if let Some((_, l)) = creat {
        a.bind(l);
        a.ld(arg_lo(1));
        a.jump(JMP_JSET_K, SET_ID, Target::Eperm, checked);
    }
    if supervise {
        // utimensat(dirfd, NULL, ...) changes the fd's file: not ours.
        a.bind(utimensat);
        a.ld(arg_lo(1));
        a.jump(JMP_JEQ_K, 0, Target::Next, Target::Notify);
        a.ld(arg_hi(1));
        a.jump(JMP_JEQ_K, 0, Target::Allow, Target::Notify);
    }
    a.finish()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Runs a classic-BPF program over `seccomp_data` (the subset built
    /// above) and returns the action, as the kernel would.
    pub fn run(prog: &[Insn], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::new();
        data.extend_from_slice(&nr.to_le_bytes());
        data.extend_from_slice(&arch.to_le_bytes());
        data.extend_from_slice(&0u64.to_le_bytes());
        for a in args {
            data.extend_from_slice(&a.to_le_bytes());
        }
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    let o = i.k as usize;
                    acc = u32::from_le_bytes(data[o..o + 4].try_into().unwrap());
                }
                JMP_JA => pc += i.k as usize,
                JMP_JEQ_K | JMP_JGE_K | JMP_JSET_K => {
                    let taken = match i.code {
                        JMP_JEQ_K => acc == i.k,
                        JMP_JGE_K => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += if taken { i.jt } else { i.jf } as usize;
                }
                RET_K => return i.k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    fn call(supervise: bool, nr: u32, args: [u64; 6]) -> u32 {
        run(&program(&NATIVE, supervise), nr, NATIVE.arch, args)
    }

    fn openat(flags: i32, mode: u32) -> [u64; 6] {
        [
            libc::AT_FDCWD as u64,
            0x1000,
            flags as u64,
            mode as u64,
            0,
            0,
        ]
    }

    #[test]
    fn set_id_bits_are_refused_wherever_a_mode_is_given() {
        for supervise in [false, true] {
            let o = libc::SYS_openat as u32;
            let create = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
            assert_eq!(call(supervise, o, openat(create, 0o4755)), RET_EPERM);
            assert_eq!(call(supervise, o, openat(create, 0o2755)), RET_EPERM);
            assert_ne!(call(supervise, o, openat(create, 0o755)), RET_EPERM);
            // Without O_CREAT the mode means nothing: never refused for it.
            assert_eq!(
                call(supervise, o, openat(libc::O_RDONLY, 0o4755)),
                RET_ALLOW
            );
            let tmpfile = libc::O_TMPFILE | libc::O_RDWR;
            assert_eq!(call(supervise, o, openat(tmpfile, 0o6700)), RET_EPERM);
            let fchmodat = libc::SYS_fchmodat as u32;
            assert_eq!(
                call(supervise, fchmodat, [0, 0x10, 0o4755, 0, 0, 0]),
                RET_EPERM
            );
            assert_eq!(
                call(supervise, fchmodat, [0, 0x10, 0o1777, 0, 0, 0]),
                RET_ALLOW
            );
            let fchmod = libc::SYS_fchmod as u32;
            assert_eq!(call(supervise, fchmod, [3, 0o2000, 0, 0, 0, 0]), RET_EPERM);
            assert_eq!(call(supervise, fchmod, [3, 0o644, 0, 0, 0, 0]), RET_ALLOW);
            let mknodat = libc::SYS_mknodat as u32;
            assert_eq!(
                call(
                    supervise,
                    mknodat,
                    [0, 0x10, (libc::S_IFREG | 0o4755) as u64, 0, 0, 0]
                ),
                RET_EPERM
            );
            assert_eq!(
                call(supervise, SYS_FCHMODAT2, [0, 0x10, 0o6755, 0, 0, 0]),
                RET_EPERM
            );
            #[cfg(target_arch = "x86_64")]
            {
                assert_eq!(
                    call(
                        supervise,
                        libc::SYS_chmod as u32,
                        [0x10, 0o4711, 0, 0, 0, 0]
                    ),
                    RET_EPERM
                );
                assert_eq!(
                    call(
                        supervise,
                        libc::SYS_creat as u32,
                        [0x10, 0o4711, 0, 0, 0, 0]
                    ),
                    RET_EPERM
                );
                assert_ne!(
                    call(supervise, libc::SYS_creat as u32, [0x10, 0o644, 0, 0, 0, 0]),
                    RET_EPERM
                );
                let open = libc::SYS_open as u32;
                let args = [
                    0x10,
                    (libc::O_CREAT | libc::O_WRONLY) as u64,
                    0o4755,
                    0,
                    0,
                    0,
                ];
                assert_eq!(call(supervise, open, args), RET_EPERM);
            }
        }
    }

    #[test]
    fn calls_that_would_bypass_the_checks_are_refused() {
        for supervise in [false, true] {
            assert_eq!(
                call(supervise, libc::SYS_openat2 as u32, [0; 6]),
                RET_ENOSYS
            );
            assert_eq!(
                call(supervise, libc::SYS_io_uring_setup as u32, [0; 6]),
                RET_ENOSYS
            );
            assert_eq!(
                call(supervise, libc::SYS_userfaultfd as u32, [0; 6]),
                RET_EPERM
            );
            for nr in [
                libc::SYS_read,
                libc::SYS_write,
                libc::SYS_close,
                libc::SYS_execve,
            ] {
                assert_eq!(call(supervise, nr as u32, [0; 6]), RET_ALLOW, "{nr}");
            }
        }
    }

    #[test]
    fn only_a_supervised_sandbox_hands_calls_over() {
        let o = libc::SYS_openat as u32;
        // Every open that makes or empties a file, whatever else its
        // flags say.
        for flags in [
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            libc::O_WRONLY | libc::O_CREAT,
            libc::O_RDWR | libc::O_CREAT | libc::O_APPEND,
            libc::O_WRONLY | libc::O_TRUNC,
        ] {
            assert_eq!(
                call(true, o, openat(flags, 0o644)),
                RET_USER_NOTIF,
                "{flags:#o}"
            );
            assert_eq!(
                call(false, o, openat(flags, 0o644)),
                RET_ALLOW,
                "{flags:#o}"
            );
        }
        // A setuid mode is refused before anything is handed over.
        let excl = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        assert_eq!(call(true, o, openat(excl, 0o4644)), RET_EPERM);
        // Opens that make nothing stay the kernel's: reads and writes in
        // place cost nothing.
        for flags in [
            libc::O_RDONLY,
            libc::O_RDONLY | libc::O_CLOEXEC,
            libc::O_WRONLY,
            libc::O_RDWR,
            libc::O_WRONLY | libc::O_EXCL,
        ] {
            assert_eq!(call(true, o, openat(flags, 0o644)), RET_ALLOW, "{flags:#o}");
        }
        for nr in [
            libc::SYS_mkdirat as u32,
            libc::SYS_renameat2 as u32,
            libc::SYS_linkat as u32,
            libc::SYS_symlinkat as u32,
        ] {
            assert_eq!(call(true, nr, [0; 6]), RET_USER_NOTIF, "{nr}");
            assert_eq!(call(false, nr, [0; 6]), RET_ALLOW, "{nr}");
        }
        let unlinkat = libc::SYS_unlinkat as u32;
        let rmdir = [3, 0x1000, libc::AT_REMOVEDIR as u64, 0, 0, 0];
        for args in [[3, 0x1000, 0, 0, 0, 0], rmdir] {
            assert_eq!(call(true, unlinkat, args), RET_USER_NOTIF);
            assert_eq!(call(false, unlinkat, args), RET_ALLOW);
        }
        let ut = libc::SYS_utimensat as u32;
        assert_eq!(call(true, ut, [3, 0, 0, 0, 0, 0]), RET_ALLOW, "futimens");
        assert_eq!(
            call(true, ut, [3, 0x7fff_0000_1000, 0, 0, 0, 0]),
            RET_USER_NOTIF
        );
        assert_eq!(
            call(true, ut, [3, 0x1_0000_0000, 0, 0, 0, 0]),
            RET_USER_NOTIF
        );
        #[cfg(target_arch = "x86_64")]
        {
            for nr in [
                libc::SYS_rename,
                libc::SYS_mkdir,
                libc::SYS_rmdir,
                libc::SYS_unlink,
                libc::SYS_link,
                libc::SYS_symlink,
            ] {
                assert_eq!(call(true, nr as u32, [0; 6]), RET_USER_NOTIF, "{nr}");
            }
            let creat = libc::SYS_creat as u32;
            assert_eq!(call(true, creat, [0x10, 0o644, 0, 0, 0, 0]), RET_USER_NOTIF);
            assert_eq!(call(false, creat, [0x10, 0o644, 0, 0, 0, 0]), RET_ALLOW);
            assert_eq!(
                call(true, libc::SYS_chmod as u32, [0x10, 0o644, 0, 0, 0, 0]),
                RET_ALLOW
            );
        }
    }

    #[test]
    fn foreign_abis_and_x32_are_refused() {
        for supervise in [false, true] {
            let prog = program(&NATIVE, supervise);
            // i386 (AUDIT_ARCH_I386) and arm (AUDIT_ARCH_ARM).
            for arch in [0x4000_0003u32, 0x4000_0028] {
                assert_eq!(run(&prog, 5, arch, [0; 6]), RET_ENOSYS);
            }
            if let Some(bit) = NATIVE.x32_bit {
                assert_eq!(
                    run(&prog, bit | libc::SYS_read as u32, NATIVE.arch, [0; 6]),
                    RET_ENOSYS
                );
            }
        }
    }
}
