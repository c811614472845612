//! The protected list, in one place: files and directories inside a
//! writable workspace that the user's own, unsandboxed tools later run or
//! obey. An agent that may write them can escape later, when the user's
//! editor or git does what the file says. They are denied by default and
//! may be granted through the allow flow (a project's `deny` entries are
//! protected too, but never prompted).

/// Whether an entry is a directory (everything beneath it) or one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Dir,
    File,
}

/// One protected name, relative to where it applies, and why.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub name: &'static str,
    pub shape: Shape,
    pub why: &'static str,
}

/// Inside every git directory (the common dir of a worktree) found under a
/// root when the sandbox is armed. A repository the agent creates later is
/// not covered: its hooks run only when the agent or the user runs git in
/// it, which the user chose to do.
pub const IN_GIT_DIR: &[Entry] = &[
    Entry {
        name: "hooks",
        shape: Shape::Dir,
        why: "git runs the scripts in .git/hooks on commit, checkout, merge and push, outside the sandbox when the user runs git",
    },
    Entry {
        name: "config",
        shape: Shape::File,
        why: ".git/config can name programs git runs (core.fsmonitor runs on every git status, core.hooksPath, aliases, filters)",
    },
    Entry {
        name: "config.worktree",
        shape: Shape::File,
        why: "a worktree's own git config can name programs git runs, as .git/config can",
    },
    Entry {
        name: "commondir",
        shape: Shape::File,
        why: "commondir points git at another directory's config and hooks, which git then obeys",
    },
];

/// At every session root and every repository's work tree.
pub const IN_WORK_TREE: &[Entry] = &[
    Entry {
        name: ".vscode",
        shape: Shape::Dir,
        why: "VS Code runs tasks, launch configurations and settings-defined commands from .vscode",
    },
    Entry {
        name: ".idea",
        shape: Shape::Dir,
        why: "JetBrains IDEs run run-configurations and external tools defined in .idea",
    },
    Entry {
        name: ".zed",
        shape: Shape::Dir,
        why: "Zed runs tasks and starts language servers and agents configured in .zed",
    },
    Entry {
        name: ".envrc",
        shape: Shape::File,
        why: "direnv runs .envrc in the user's shell when they cd into the folder",
    },
    Entry {
        name: ".mcp.json",
        shape: Shape::File,
        why: "agents and editors start the MCP servers listed in .mcp.json, unsandboxed",
    },
    Entry {
        name: ".pre-commit-config.yaml",
        shape: Shape::File,
        why: "pre-commit runs the hooks it lists (a `repo: local` entry runs any command) on the user's next git commit",
    },
    Entry {
        name: "lefthook.yml",
        shape: Shape::File,
        why: "lefthook runs the commands it lists on the user's git hooks",
    },
    Entry {
        name: ".lefthook.yml",
        shape: Shape::File,
        why: "lefthook runs the commands it lists on the user's git hooks",
    },
    Entry {
        name: "lefthook-local.yml",
        shape: Shape::File,
        why: "lefthook runs the commands it lists on the user's git hooks",
    },
];
