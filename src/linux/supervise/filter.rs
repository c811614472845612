//! The seccomp program that hands the supervisor the calls that could
//! create, remove, rename or change an entry of a supervised directory.
//! Pure: the program is data, built here and checked by a small classic-BPF
//! interpreter in the tests; `kernel` installs it.
//!
//! What it does, in order:
//! 1. a call of a foreign ABI (an i386 process on x86_64, an arm32 one on
//!    arm64) or of x32 gets ENOSYS: syscall numbers mean other things there,
//!    so the checks below would be wrong for them;
//! 2. the calls an atomic save makes go to the supervisor: an exclusive
//!    create (`open`/`openat` with O_CREAT and O_EXCL), `mkdir`/`mkdirat`
//!    and `rmdir`/`unlinkat(AT_REMOVEDIR)` (lock directories), `rename`/
//!    `renameat`/`renameat2`, and `utimensat` on a path (a lock's
//!    heartbeat);
//! 3. `userfaultfd` gets EPERM: page faults a sandboxed program serves
//!    itself could stall the supervisor while it reads that program's
//!    memory (`/dev/userfaultfd` is covered by the plan);
//! 4. everything else is allowed (the sandbox's mounts and Landlock still
//!    decide it).
//!
//! The set is kept this small on purpose: every call handed over costs a
//! round trip to the supervisor, whatever file it names, so widening it
//! (every write-open, every unlink) would make all file work in the
//! workspace pay for a grant a few files in the home directory need.
//! Calls the supervisor does not take on itself continue to the kernel,
//! which judges them exactly as if no filter were there.

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
const ALU_AND_K: u16 = 0x04 | 0x50; // BPF_ALU | BPF_AND | BPF_K
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

/// An exclusive create: both bits set.
pub const EXCLUSIVE_CREATE: u32 = (libc::O_CREAT | libc::O_EXCL) as u32;

/// The native ABI's audit architecture and syscall numbers.
pub struct Abi {
    pub arch: u32,
    /// Numbers at or above this are x32 calls (x86_64 only).
    pub x32_bit: Option<u32>,
    /// `(nr, index of the flags argument)` for the opens.
    pub opens: &'static [(u32, u32)],
    /// Always handed to the supervisor.
    pub always: &'static [u32],
    /// `unlinkat`: handed over only with AT_REMOVEDIR.
    pub unlinkat: u32,
    /// `utimensat`: handed over only when its path argument is not NULL.
    pub utimensat: u32,
    /// `userfaultfd`: refused.
    pub userfaultfd: u32,
}

#[cfg(target_arch = "x86_64")]
pub const NATIVE: Abi = Abi {
    arch: 0xC000_003E, // AUDIT_ARCH_X86_64
    x32_bit: Some(0x4000_0000),
    opens: &[(libc::SYS_openat as u32, 2), (libc::SYS_open as u32, 1)],
    always: &[
        libc::SYS_mkdir as u32,
        libc::SYS_mkdirat as u32,
        libc::SYS_rmdir as u32,
        libc::SYS_rename as u32,
        libc::SYS_renameat as u32,
        libc::SYS_renameat2 as u32,
    ],
    unlinkat: libc::SYS_unlinkat as u32,
    utimensat: libc::SYS_utimensat as u32,
    userfaultfd: libc::SYS_userfaultfd as u32,
};

#[cfg(target_arch = "aarch64")]
pub const NATIVE: Abi = Abi {
    arch: 0xC000_00B7, // AUDIT_ARCH_AARCH64
    x32_bit: None,
    opens: &[(libc::SYS_openat as u32, 2)],
    always: &[
        libc::SYS_mkdirat as u32,
        SYS_RENAMEAT_GENERIC,
        libc::SYS_renameat2 as u32,
    ],
    unlinkat: libc::SYS_unlinkat as u32,
    utimensat: libc::SYS_utimensat as u32,
    userfaultfd: libc::SYS_userfaultfd as u32,
};

/// `renameat` in the generic table (arm64); libc leaves it out there.
#[cfg(target_arch = "aarch64")]
pub const SYS_RENAMEAT_GENERIC: u32 = 38;

/// A tiny assembler: jumps name their targets, resolved at the end.
struct Asm {
    code: Vec<(Insn, Option<(Target, Target)>)>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    Next,
    Allow,
    Notify,
    Enosys,
    Eperm,
    /// The instruction at this index.
    At(usize),
}

impl Asm {
    fn ld(&mut self, off: u32) {
        self.code.push((
            Insn {
                code: LD_W_ABS,
                jt: 0,
                jf: 0,
                k: off,
            },
            None,
        ));
    }
    fn and(&mut self, k: u32) {
        self.code.push((
            Insn {
                code: ALU_AND_K,
                jt: 0,
                jf: 0,
                k,
            },
            None,
        ));
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
    fn here(&self) -> usize {
        self.code.len()
    }
    fn finish(mut self) -> Vec<Insn> {
        // The exits come last, in a fixed order.
        let allow = self.code.len();
        let notify = allow + 1;
        let enosys = allow + 2;
        let eperm = allow + 3;
        let n = self.code.len();
        let mut out = Vec::with_capacity(n + 4);
        for (i, (mut insn, jumps)) in self.code.drain(..).enumerate() {
            if let Some((jt, jf)) = jumps {
                let resolve = |t: Target| -> u8 {
                    let to = match t {
                        Target::Next => i + 1,
                        Target::Allow => allow,
                        Target::Notify => notify,
                        Target::Enosys => enosys,
                        Target::Eperm => eperm,
                        Target::At(x) => x,
                    };
                    u8::try_from(to - i - 1).expect("a seccomp jump longer than 255")
                };
                insn.jt = resolve(jt);
                insn.jf = resolve(jf);
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

/// The program for `abi`.
pub fn program(abi: &Abi) -> Vec<Insn> {
    let mut a = Asm { code: Vec::new() };
    a.ld(OFF_ARCH);
    a.jump(JMP_JEQ_K, abi.arch, Target::Next, Target::Enosys);
    a.ld(OFF_NR);
    if let Some(bit) = abi.x32_bit {
        a.jump(JMP_JGE_K, bit, Target::Enosys, Target::Next);
    }
    // Dispatch: each open jumps to its own flags check, placed after the
    // list; the rest go straight to an exit.
    let mut open_checks = Vec::new();
    for &(nr, flags_arg) in abi.opens {
        open_checks.push((a.here(), flags_arg));
        a.jump(JMP_JEQ_K, nr, Target::At(usize::MAX), Target::Next);
    }
    for &nr in abi.always {
        a.jump(JMP_JEQ_K, nr, Target::Notify, Target::Next);
    }
    a.jump(JMP_JEQ_K, abi.userfaultfd, Target::Eperm, Target::Next);
    let unlinkat_at = a.here();
    a.jump(
        JMP_JEQ_K,
        abi.unlinkat,
        Target::At(usize::MAX),
        Target::Next,
    );
    let utimensat_at = a.here();
    a.jump(
        JMP_JEQ_K,
        abi.utimensat,
        Target::At(usize::MAX),
        Target::Allow,
    );
    for (jump_at, flags_arg) in open_checks {
        let check = a.here();
        a.code[jump_at].1 = Some((Target::At(check), Target::Next));
        a.ld(arg_lo(flags_arg));
        a.and(EXCLUSIVE_CREATE);
        a.jump(JMP_JEQ_K, EXCLUSIVE_CREATE, Target::Notify, Target::Allow);
    }
    // unlinkat removes a directory only with AT_REMOVEDIR.
    let check = a.here();
    a.code[unlinkat_at].1 = Some((Target::At(check), Target::Next));
    a.ld(arg_lo(2));
    a.jump(
        JMP_JSET_K,
        libc::AT_REMOVEDIR as u32,
        Target::Notify,
        Target::Allow,
    );
    // utimensat(dirfd, NULL, ...) changes the fd's file: not ours.
    let check = a.here();
    a.code[utimensat_at].1 = Some((Target::At(check), Target::Allow));
    a.ld(arg_lo(1));
    a.jump(JMP_JEQ_K, 0, Target::Next, Target::Notify);
    a.ld(arg_hi(1));
    a.jump(JMP_JEQ_K, 0, Target::Allow, Target::Notify);
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
                ALU_AND_K => acc &= i.k,
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

    fn call(nr: u32, args: [u64; 6]) -> u32 {
        run(&program(&NATIVE), nr, NATIVE.arch, args)
    }

    #[test]
    fn exclusive_creates_reach_the_supervisor_and_other_opens_do_not() {
        let openat = libc::SYS_openat as u32;
        let f = |flags: i32| [libc::AT_FDCWD as u64, 0x1000, flags as u64, 0o644, 0, 0];
        for flags in [
            libc::O_RDONLY,
            libc::O_RDONLY | libc::O_CLOEXEC,
            libc::O_WRONLY,
            libc::O_RDWR,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            libc::O_WRONLY | libc::O_EXCL,
        ] {
            assert_eq!(call(openat, f(flags)), RET_ALLOW, "{flags:#o}");
        }
        for flags in [
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
        ] {
            assert_eq!(call(openat, f(flags)), RET_USER_NOTIF, "{flags:#o}");
        }
        #[cfg(target_arch = "x86_64")]
        {
            let open = libc::SYS_open as u32;
            assert_eq!(
                call(open, [0x1000, libc::O_RDONLY as u64, 0, 0, 0, 0]),
                RET_ALLOW
            );
            let excl = (libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL) as u64;
            assert_eq!(call(open, [0x1000, excl, 0, 0, 0, 0]), RET_USER_NOTIF);
            for nr in [libc::SYS_rename, libc::SYS_mkdir, libc::SYS_rmdir] {
                assert_eq!(call(nr as u32, [0; 6]), RET_USER_NOTIF, "{nr}");
            }
            for nr in [libc::SYS_creat, libc::SYS_unlink, libc::SYS_chmod] {
                assert_eq!(call(nr as u32, [0; 6]), RET_ALLOW, "{nr}");
            }
        }
    }

    #[test]
    fn entry_changes_reach_the_supervisor_and_fd_calls_do_not() {
        for nr in [libc::SYS_mkdirat as u32, libc::SYS_renameat2 as u32] {
            assert_eq!(call(nr, [0; 6]), RET_USER_NOTIF, "{nr}");
        }
        let unlinkat = libc::SYS_unlinkat as u32;
        assert_eq!(call(unlinkat, [3, 0x1000, 0, 0, 0, 0]), RET_ALLOW, "a file");
        let rmdir = [3, 0x1000, libc::AT_REMOVEDIR as u64, 0, 0, 0];
        assert_eq!(call(unlinkat, rmdir), RET_USER_NOTIF, "a directory");
        let ut = libc::SYS_utimensat as u32;
        assert_eq!(call(ut, [3, 0, 0, 0, 0, 0]), RET_ALLOW, "futimens");
        assert_eq!(call(ut, [3, 0x7fff_0000_1000, 0, 0, 0, 0]), RET_USER_NOTIF);
        assert_eq!(call(ut, [3, 0x1_0000_0000, 0, 0, 0, 0]), RET_USER_NOTIF);
        for nr in [
            libc::SYS_read as u32,
            libc::SYS_write as u32,
            libc::SYS_fchmod as u32,
            libc::SYS_fchmodat as u32,
            libc::SYS_close as u32,
            libc::SYS_execve as u32,
        ] {
            assert_eq!(call(nr, [0; 6]), RET_ALLOW, "{nr}");
        }
        assert_eq!(call(libc::SYS_userfaultfd as u32, [0; 6]), RET_EPERM);
    }

    #[test]
    fn foreign_abis_and_x32_are_refused() {
        let prog = program(&NATIVE);
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
