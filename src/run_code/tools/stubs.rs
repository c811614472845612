//! The stub modules a run imports to call its tools (pure builders: text
//! in, text out). Python gets `zcode_tools.py` beside the source (the
//! script's directory is first on `sys.path`); node and typescript get a
//! package `zcode-tools` under the call directory's `node_modules/` (ES
//! modules ignore NODE_PATH), with an ES module, a CommonJS twin for
//! `require`, and type declarations.
//!
//! Tool names and descriptions come from MCP servers, so nothing of them
//! is pasted into code as it is: names become checked identifiers, and
//! every string is a JSON literal (valid in Python and JavaScript alike).
//!
//! A group (a server's tools) never becomes a name the stub's own code
//! reads: a server may be called `dict`, `str`, `process` or `JSON`, and
//! the stub uses those. Python keeps the groups in a private dict that the
//! module's `__getattr__` serves; JavaScript binds each to a private
//! `__zc_g_` name and exports it under the group's.

use std::collections::BTreeMap;

use serde_json::Value;

use super::ToolSpec;

/// The module's name, in both languages.
pub const PYTHON_MODULE: &str = "zcode_tools";
pub const NODE_PACKAGE: &str = "zcode-tools";

/// Names the modules define themselves (every module-level name of the
/// Python stub: a group named so would be hidden by it; the exports of
/// the JavaScript one), and the languages' keywords: a tool group or a
/// tool named so gets a trailing `_`.
const TAKEN: &[&str] = &[
    "call",
    "result",
    "log",
    "ToolError",
    "default",
    "and",
    "as",
    "assert",
    "async",
    "await",
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "debugger",
    "def",
    "del",
    "delete",
    "do",
    "elif",
    "else",
    "enum",
    "except",
    "export",
    "extends",
    "false",
    "False",
    "finally",
    "for",
    "from",
    "function",
    "global",
    "if",
    "import",
    "in",
    "instanceof",
    "is",
    "lambda",
    "let",
    "new",
    "None",
    "nonlocal",
    "not",
    "null",
    "or",
    "pass",
    "raise",
    "return",
    "static",
    "super",
    "switch",
    "this",
    "throw",
    "true",
    "True",
    "try",
    "typeof",
    "var",
    "void",
    "while",
    "with",
    "yield",
    "package",
    "public",
    "private",
    "protected",
    "interface",
    "implements",
    "eval",
    "arguments",
    "require",
    "module",
    "exports",
    "self",
    "name",
    // The Python stub's own names.
    "_json",
    "_os",
    "_socket",
    "_threading",
    "_types",
    "_local",
    "_ids",
    "_ids_lock",
    "_connection",
    "_rpc",
    "_drop",
    "_Group",
    "_SOCKET_ENV",
    "_TOKEN",
    "_builtins",
    "_groups",
    "_tool",
];

/// `name` as an identifier of both languages: ASCII letters, digits and
/// `_`, not starting with a digit, not a keyword.
pub fn identifier(name: &str) -> String {
    let mut id: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if id.is_empty() || id.starts_with(|c: char| c.is_ascii_digit()) {
        id.insert(0, '_');
    }
    // The stubs' own names all start with `__zc_` or `_`.
    if TAKEN.contains(&id.as_str()) || id.starts_with("__") {
        id.push('_');
    }
    id
}

/// One server's tools, as the stubs name them.
struct Group<'a> {
    /// The server's name, as the session has it.
    server: &'a str,
    /// The identifier code reaches it by.
    id: String,
    /// Each tool with the identifier it is called by.
    members: Vec<(String, &'a ToolSpec)>,
}

/// The tools grouped by what comes before their first `.` (the server),
/// in the order of the servers' names. Two servers, or two tools of one,
/// whose names read the same as identifiers get `_2`, `_3`...
fn grouped(specs: &[ToolSpec]) -> Vec<Group<'_>> {
    let mut by_server: BTreeMap<&str, Vec<&ToolSpec>> = BTreeMap::new();
    for spec in specs {
        let (server, _) = spec.name.split_once('.').unwrap_or(("tools", &spec.name));
        by_server.entry(server).or_default().push(spec);
    }
    let mut groups: Vec<Group> = Vec::with_capacity(by_server.len());
    for (server, tools) in by_server {
        let id = unique(identifier(server), |id| groups.iter().any(|g| g.id == id));
        let mut members: Vec<(String, &ToolSpec)> = Vec::with_capacity(tools.len());
        for spec in tools {
            let tool = spec
                .name
                .split_once('.')
                .map_or(spec.name.as_str(), |(_, t)| t);
            let tid = unique(identifier(tool), |id| members.iter().any(|(m, _)| m == id));
            members.push((tid, spec));
        }
        groups.push(Group {
            server,
            id,
            members,
        });
    }
    groups
}

/// `base`, or `base_2`, `base_3`... the first one not `taken`.
fn unique(base: String, taken: impl Fn(&str) -> bool) -> String {
    let mut id = base.clone();
    let mut n = 2;
    while taken(&id) {
        id = format!("{base}_{n}");
        n += 1;
    }
    id
}

/// What the stubs call differently from its own name (a server or tool
/// name that is not an identifier of both languages, or is one the stub
/// or the languages keep), said to the run so that code can find it.
pub fn renames(specs: &[ToolSpec]) -> Vec<String> {
    let mut out = Vec::new();
    for g in grouped(specs) {
        if g.id != g.server {
            out.push(format!(
                "the MCP server {:?} is `{}` in code (its name is not an identifier the stubs can use)",
                g.server, g.id
            ));
        }
        for (id, spec) in &g.members {
            let tool = spec
                .name
                .split_once('.')
                .map_or(spec.name.as_str(), |(_, t)| t);
            if id != tool {
                out.push(format!(
                    "the tool {:?} is `{}.{id}` in code",
                    spec.name, g.id
                ));
            }
        }
    }
    out
}

/// The private name a group is bound to in the JavaScript stubs.
fn js_binding(group: &str) -> String {
    format!("__zc_g_{group}")
}

fn literal(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// A tool's documentation: its description and its parameters as the
/// input schema gives them.
fn doc(spec: &ToolSpec) -> String {
    let mut d = spec.description.trim().to_owned();
    let props = spec
        .input_schema
        .get("properties")
        .and_then(Value::as_object);
    let required: Vec<&str> = spec
        .input_schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(props) = props.filter(|p| !p.is_empty()) {
        d.push_str("\n\nParameters:\n");
        for (name, schema) in props {
            let ty = schema
                .get("type")
                .map(|t| t.to_string())
                .unwrap_or_default();
            let what = schema
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("");
            let req = if required.contains(&name.as_str()) {
                "required"
            } else {
                "optional"
            };
            d.push_str(&format!(
                "  {name} ({} {req}): {what}\n",
                ty.trim_matches('"')
            ));
        }
    }
    d.push_str(&format!(
        "\nCalls `{}`; raises ToolError on failure.",
        spec.name
    ));
    d
}

/// `zcode_tools.py`.
pub fn python(specs: &[ToolSpec], socket_env: &str, token_env: &str) -> String {
    let mut out = String::from(PYTHON_HEAD)
        .replace("@SOCKET_ENV@", &literal(socket_env))
        .replace("@TOKEN_ENV@", &literal(token_env));
    for g in grouped(specs) {
        let tools: Vec<String> = g
            .members
            .iter()
            .map(|(id, spec)| {
                format!(
                    "    {id_lit}: _tool({name}, {id_lit}, {doc}),\n",
                    id_lit = literal(id),
                    name = literal(&spec.name),
                    doc = literal(&doc(spec)),
                )
            })
            .collect();
        out.push_str(&format!(
            "_groups[{id}] = _Group({server}, {{\n{}}})\n",
            tools.concat(),
            id = literal(&g.id),
            server = literal(g.server),
        ));
    }
    out.push_str(PYTHON_TAIL);
    out
}

/// The package's `index.mjs` (ES module).
pub fn node_esm(specs: &[ToolSpec], socket_env: &str, token_env: &str) -> String {
    let body = node_body(specs, socket_env, token_env);
    let groups: Vec<String> = grouped(specs).into_iter().map(|g| g.id).collect();
    let mut out = format!("import __zc_net from \"node:net\";\n{body}");
    for g in &groups {
        out.push_str(&format!("export {{ {} as {g} }};\n", js_binding(g)));
    }
    out.push_str("export { ToolError, call, result, log };\n");
    out.push_str(&format!(
        "export default {{ ToolError, call, result, log{} }};\n",
        js_fields(&groups)
    ));
    out
}

/// The package's `index.cjs` (for `require`, from a CommonJS source).
pub fn node_cjs(specs: &[ToolSpec], socket_env: &str, token_env: &str) -> String {
    let body = node_body(specs, socket_env, token_env);
    let groups: Vec<String> = grouped(specs).into_iter().map(|g| g.id).collect();
    format!(
        "\"use strict\";\nconst __zc_net = require(\"node:net\");\n{body}module.exports = {{ ToolError, call, result, log{} }};\n",
        js_fields(&groups)
    )
}

/// `, fs: __zc_g_fs, ...`: the groups as fields of an exported object.
fn js_fields(groups: &[String]) -> String {
    groups
        .iter()
        .map(|g| format!(", {g}: {}", js_binding(g)))
        .collect()
}

fn node_body(specs: &[ToolSpec], socket_env: &str, token_env: &str) -> String {
    let mut out = String::from(NODE_BODY)
        .replace("@SOCKET_ENV@", &literal(socket_env))
        .replace("@TOKEN_ENV@", &literal(token_env));
    for g in grouped(specs) {
        out.push_str(&format!("const {} = Object.freeze({{\n", js_binding(&g.id)));
        for (id, spec) in &g.members {
            out.push_str(&format!(
                "  {}\n  {id}: (args = {{}}) => call({}, args),\n",
                js_comment(&doc(spec)),
                literal(&spec.name)
            ));
        }
        out.push_str("});\n");
    }
    out
}

/// A JSDoc comment that no text can end early.
fn js_comment(text: &str) -> String {
    let safe = text.replace("*/", "*\\/");
    format!(
        "/**\n{}\n   */",
        safe.lines()
            .map(|l| format!("   * {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

/// The package's `index.d.ts`: each tool's arguments as a type.
pub fn node_types(specs: &[ToolSpec]) -> String {
    let mut out = String::from(
        "export declare class ToolError extends Error {\n  /** not_allowed, call_limit, too_large, timeout, too_many_at_once, tool_error, unavailable, bad_request, bad_token */\n  code: string;\n}\n\
         /** Calls a tool by its full name (`server.tool`). */\n\
         export declare function call(name: string, args?: Record<string, unknown>): Promise<unknown>;\n\
         /** Sets the call's structured `result` (JSON; the last call wins). */\n\
         export declare function result(value: unknown): Promise<void>;\n\
         /** Adds an entry to the call's `logs`. */\n\
         export declare function log(level: \"debug\" | \"info\" | \"warn\" | \"error\", message: string): Promise<void>;\n",
    );
    let groups = grouped(specs);
    for g in &groups {
        let binding = js_binding(&g.id);
        out.push_str(&format!("declare const {binding}: {{\n"));
        for (id, spec) in &g.members {
            out.push_str(&format!(
                "  {}\n  {id}(args: {}): Promise<unknown>;\n",
                js_comment(&doc(spec)),
                ts_object(&spec.input_schema)
            ));
        }
        out.push_str(&format!("}};\nexport {{ {binding} as {} }};\n", g.id));
    }
    out.push_str(&format!(
        "declare const _default: {{ ToolError: typeof ToolError; call: typeof call; result: typeof result; log: typeof log{} }};\nexport default _default;\n",
        groups
            .iter()
            .map(|g| format!("; {}: typeof {}", g.id, js_binding(&g.id)))
            .collect::<String>()
    ));
    out
}

fn ts_object(schema: &Value) -> String {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return "Record<string, unknown>".into();
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let fields: Vec<String> = props
        .iter()
        .map(|(name, s)| {
            let opt = if required.contains(&name.as_str()) {
                ""
            } else {
                "?"
            };
            format!("{}{opt}: {}", literal(name), ts_type(s))
        })
        .collect();
    format!("{{ {} }}", fields.join("; "))
}

fn ts_type(schema: &Value) -> String {
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => "string".into(),
        Some("number" | "integer") => "number".into(),
        Some("boolean") => "boolean".into(),
        Some("null") => "null".into(),
        Some("array") => match schema.get("items") {
            Some(items) => format!("Array<{}>", ts_type(items)),
            None => "unknown[]".into(),
        },
        Some("object") => ts_object(schema),
        _ => "unknown".into(),
    }
}

/// The package's `package.json`.
pub fn node_package() -> String {
    serde_json::json!({
        "name": NODE_PACKAGE,
        "private": true,
        "type": "module",
        "types": "./index.d.ts",
        "exports": {".": {
            "types": "./index.d.ts",
            "import": "./index.mjs",
            "require": "./index.cjs"
        }}
    })
    .to_string()
}

const PYTHON_HEAD: &str = r#""""The tools this run may call (written by zcode-acp for one run_code call).

    import zcode_tools
    files = zcode_tools.fs.list_files({"path": "."})   # or list_files(path=".")
    zcode_tools.log("info", f"{len(files)} files")
    zcode_tools.result({"count": len(files)})

Every function raises zcode_tools.ToolError (with .code) when the call is
refused or fails; catch it to go on. Each MCP server's tools are a group,
zcode_tools.<server>; `from zcode_tools import *` leaves out a group named
after a Python built-in (`dict`, `str`...), which it would hide.
"""
import builtins as _builtins
import json as _json
import os as _os
import socket as _socket
import threading as _threading
import types as _types

__all__ = ["ToolError", "call", "result", "log"]


class ToolError(Exception):
    """A refused or failed call. `code`: not_allowed, call_limit, too_large,
    timeout, too_many_at_once, tool_error, unavailable, bad_request or bad_token."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


_SOCKET_ENV = @SOCKET_ENV@
# Every request carries the run's token (read once: a script that clears
# its environment keeps its tools).
_TOKEN = _os.environ.get(@TOKEN_ENV@, "")
_local = _threading.local()
_ids = iter(range(1, 1 << 62))
_ids_lock = _threading.Lock()


def _connection():
    held = getattr(_local, "held", None)
    # A forked child (multiprocessing) must not share its parent's
    # connection: it makes its own.
    if held is not None and held[2] != _os.getpid():
        held = None
    if held is None:
        path = _os.environ.get(_SOCKET_ENV)
        if not path:
            raise ToolError("unavailable", f"${_SOCKET_ENV} is not set: tools work only in a run_code run that asked for them")
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            s.connect(path)
        except OSError as e:
            s.close()
            raise ToolError("unavailable", f"cannot reach the tools server: {e}") from None
        held = _local.held = (s, s.makefile("rb"), _os.getpid())
    return held[0], held[1]


def _rpc(method, params):
    with _ids_lock:
        i = next(_ids)
    try:
        line = _json.dumps({"id": i, "token": _TOKEN, "jsonrpc": "2.0", "method": method, "params": params},
                           separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise ToolError("bad_request", f"not JSON: {e}") from None
    s, reader = _connection()
    try:
        s.sendall(line.encode("utf-8") + b"\n")
        while True:
            answer = reader.readline()
            if not answer:
                _drop()
                raise ToolError("unavailable", "the tools server closed the connection (the run is ending)")
            m = _json.loads(answer)
            if m.get("id") == i:
                break
    except OSError as e:
        _drop()
        raise ToolError("unavailable", f"the tools server connection failed: {e}") from None
    if "error" in m:
        e = m["error"]
        data = e.get("data") or {}
        # The server closed this connection after it: the next call opens
        # another.
        if data.get("closed"):
            _drop()
        raise ToolError(data.get("code", "error"), e.get("message", ""))
    return m.get("result")


def _drop():
    held = getattr(_local, "held", None)
    _local.held = None
    if held is not None:
        held[1].close()
        held[0].close()


def call(_name, _args=None, /, **kwargs):
    """Calls a tool by its full name (`server.tool`) with a dict of arguments
    (or keyword arguments); returns what it returned."""
    merged = dict(_args or {})
    merged.update(kwargs)
    return _rpc("call", {"tool": _name, "args": merged})


def result(value):
    """Sets the call's structured `result` (JSON; the last call wins)."""
    _rpc("result", {"value": value})


def log(level, message):
    """Adds {level, message, t} to the call's `logs` (debug, info, warn, error)."""
    _rpc("log", {"level": str(level), "message": str(message)})


class _Group(_types.SimpleNamespace):
    def __init__(self, _name, _tools, /):
        super().__init__()
        for k, f in _tools.items():
            setattr(self, k, f)
        self.__doc__ = f"Tools of the MCP server {_name!r}."


def _tool(_name, _id, _doc):
    def tool(_args=None, /, **kwargs):
        return call(_name, _args, **kwargs)
    tool.__name__ = tool.__qualname__ = _id
    tool.__doc__ = _doc
    return tool


# The groups, by the name code reaches them by. Never module globals: a
# server may be named after a built-in this module's own code uses.
_groups = {}
"#;

/// The end of `zcode_tools.py`: the groups, served as the module's
/// attributes.
const PYTHON_TAIL: &str = r#"

def __getattr__(name):
    try:
        return _groups[name]
    except KeyError:
        raise AttributeError(f"zcode_tools has no {name!r}: this run's tool groups are {sorted(_groups)} (list a tool in run_code's `tools` to have it here)") from None


def __dir__():
    return sorted(set(globals()) | set(_groups))


__all__.extend(n for n in _groups if not hasattr(_builtins, n))
"#;

const NODE_BODY: &str = r#"// The tools this run may call (written by zcode-acp for one run_code call).
//   import { fs, log, result, ToolError } from "zcode-tools";
//   const files = await fs.list_files({ path: "." });
//   await result({ count: files.length });
// Every function returns a promise, rejected with a ToolError (with .code)
// when the call is refused or fails.
class ToolError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.name = "ToolError";
    this.code = code;
  }
}
const __zc_SOCKET_ENV = @SOCKET_ENV@;
// Every request carries the run's token (read once, at load).
const __zc_TOKEN = process.env[@TOKEN_ENV@] || "";
let __zc_socket = null;
let __zc_buffered = "";
let __zc_nextId = 0;
const __zc_pending = new Map();
function __zc_connection() {
  if (__zc_socket) return __zc_socket;
  const path = process.env[__zc_SOCKET_ENV];
  if (!path) throw new ToolError("unavailable", `$${__zc_SOCKET_ENV} is not set: tools work only in a run_code run that asked for them`);
  const s = __zc_net.createConnection(path);
  s.setEncoding("utf8");
  s.on("data", (chunk) => {
    __zc_buffered += chunk;
    let nl;
    while ((nl = __zc_buffered.indexOf("\n")) >= 0) {
      const line = __zc_buffered.slice(0, nl);
      __zc_buffered = __zc_buffered.slice(nl + 1);
      let m;
      try { m = JSON.parse(line); } catch { continue; }
      const p = __zc_pending.get(m.id);
      if (!p) continue;
      __zc_pending.delete(m.id);
      // Idle, the connection does not keep the script alive.
      if (__zc_pending.size === 0) s.unref();
      if (m.error) p.reject(new ToolError((m.error.data && m.error.data.code) || "error", m.error.message));
      else p.resolve(m.result);
    }
  });
  const fail = (why) => {
    for (const p of __zc_pending.values()) p.reject(new ToolError("unavailable", why));
    __zc_pending.clear();
    __zc_socket = null;
  };
  s.on("error", (e) => fail(`the tools server connection failed: ${e.message}`));
  s.on("close", () => fail("the tools server closed the connection (the run is ending)"));
  __zc_socket = s;
  return s;
}
function __zc_rpc(method, params) {
  return new Promise((resolve, reject) => {
    let line;
    try {
      line = JSON.stringify({ id: ++__zc_nextId, token: __zc_TOKEN, jsonrpc: "2.0", method, params });
    } catch (e) {
      return reject(new ToolError("bad_request", `not JSON: ${e.message}`));
    }
    let s;
    try { s = __zc_connection(); } catch (e) { return reject(e); }
    __zc_pending.set(__zc_nextId, { resolve, reject });
    s.ref();
    s.write(line + "\n");
  });
}
/** Calls a tool by its full name (`server.tool`). */
function call(name, args = {}) { return __zc_rpc("call", { tool: name, args }); }
/** Sets the call's structured `result` (JSON; the last call wins). */
function result(value) { return __zc_rpc("result", { value: value === undefined ? null : value }).then(() => undefined); }
/** Adds {level, message, t} to the call's `logs` (debug, info, warn, error). */
function log(level, message) { return __zc_rpc("log", { level: String(level), message: String(message) }).then(() => undefined); }
"#;

#[cfg(test)]
#[path = "stubs_tests.rs"]
mod tests;
