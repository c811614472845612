//! The tests of `run_code::tools::stubs`, kept beside it.

use super::*;
use serde_json::json;

fn spec(name: &str, description: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: json!({"type": "object", "properties": {"path": {"type": "string", "description": "where"}, "n": {"type": "integer"}}, "required": ["path"]}),
    }
}

#[test]
fn names_become_identifiers_of_both_languages() {
    assert_eq!(identifier("list-files"), "list_files");
    assert_eq!(identifier("2fa"), "_2fa");
    assert_eq!(identifier("class"), "class_");
    assert_eq!(identifier("result"), "result_");
    assert_eq!(identifier("é"), "_");
    let specs = [
        spec("a-b.x", ""),
        spec("a_b.x", ""),
        spec("a.b-c", ""),
        spec("a.b_c", ""),
    ];
    let g = grouped(&specs);
    let shape: Vec<(&str, &str, Vec<&str>)> = g
        .iter()
        .map(|g| {
            let ids = g.members.iter().map(|(id, _)| id.as_str()).collect();
            (g.server, g.id.as_str(), ids)
        })
        .collect();
    // Two servers are two groups, however alike their names read.
    assert_eq!(
        shape,
        [
            ("a", "a", vec!["b_c", "b_c_2"]),
            ("a-b", "a_b", vec!["x"]),
            ("a_b", "a_b_2", vec!["x"]),
        ]
    );
    let said = renames(&specs);
    assert_eq!(
        said,
        [
            "the tool \"a.b-c\" is `a.b_c` in code",
            "the tool \"a.b_c\" is `a.b_c_2` in code",
            "the MCP server \"a-b\" is `a_b` in code (its name is not an identifier the stubs can use)",
            "the MCP server \"a_b\" is `a_b_2` in code (its name is not an identifier the stubs can use)",
        ]
    );
    assert!(renames(&[spec("dict.x", ""), spec("process.y", "")]).is_empty());
}

/// Every name the Python stub defines at its top level, which a group
/// of that name would be hidden by.
fn python_globals() -> Vec<String> {
    let mut names = Vec::new();
    for line in PYTHON_HEAD.lines().chain(PYTHON_TAIL.lines()) {
        let first = line
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next();
        let word = |rest: &str| {
            rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .map(str::to_owned)
        };
        let name = if let Some(rest) = line.strip_prefix("def ").or(line.strip_prefix("class ")) {
            word(rest)
        } else if let Some((_, alias)) = line
            .strip_prefix("import ")
            .and_then(|l| l.split_once(" as "))
        {
            word(alias)
        } else if line.contains(" = ") && !line.starts_with(' ') && !line.starts_with('#') {
            first.map(str::to_owned)
        } else {
            None
        };
        names.extend(name.filter(|n| !n.is_empty()));
    }
    names
}

#[test]
fn no_group_can_be_hidden_by_a_name_of_the_stubs_own() {
    let globals = python_globals();
    for expected in [
        "_builtins",
        "_rpc",
        "_groups",
        "_tool",
        "ToolError",
        "call",
        "__getattr__",
    ] {
        assert!(
            globals.iter().any(|g| g == expected),
            "{expected} not found in {globals:?}"
        );
    }
    for name in &globals {
        assert_ne!(
            &identifier(name),
            name,
            "a group named {name} would be hidden by the stub's own"
        );
    }
}

#[test]
fn groups_never_become_names_the_stubs_own_code_reads() {
    let specs = [
        spec("dict.x", ""),
        spec("process.y", ""),
        spec("JSON.z", ""),
    ];
    let py = python(&specs, "S", "T");
    assert!(
        py.contains("_groups[\"dict\"] = _Group(\"dict\", {"),
        "{py}"
    );
    assert!(
        !py.lines()
            .any(|l| l.starts_with("dict =") || l.starts_with("def dict")),
        "{py}"
    );
    let esm = node_esm(&specs, "S", "T");
    assert!(
        esm.contains("const __zc_g_process = Object.freeze({"),
        "{esm}"
    );
    assert!(
        esm.contains("export { __zc_g_process as process };"),
        "{esm}"
    );
    assert!(
        !esm.contains("const process") && !esm.contains("const JSON"),
        "{esm}"
    );
    let cjs = node_cjs(&specs, "S", "T");
    assert!(
        cjs.contains("JSON: __zc_g_JSON, dict: __zc_g_dict, process: __zc_g_process }"),
        "{cjs}"
    );
    let ts = node_types(&specs);
    assert!(ts.contains("declare const __zc_g_JSON: {"), "{ts}");
    assert!(ts.contains("export { __zc_g_JSON as JSON };"), "{ts}");
}

#[test]
fn descriptions_cannot_break_out_of_the_generated_code() {
    let hostile = spec(
        "fs.ls",
        "\"\"\"\nimport os; os.system('x')\n*/ process.exit(1) /*\n\u{2028}",
    );
    let py = python(std::slice::from_ref(&hostile), "S", "T");
    assert!(!py.contains("\nimport os; os.system"), "{py}");
    let js = node_esm(std::slice::from_ref(&hostile), "S", "T");
    assert!(!js.contains("*/ process.exit"), "{js}");
    let ts = node_types(std::slice::from_ref(&hostile));
    assert!(!ts.contains("*/ process.exit"), "{ts}");
}

#[test]
fn each_tool_is_a_function_of_its_group_with_its_schema() {
    let specs = [
        spec("fs.list_files", "Lists files."),
        spec("fs.read", "Reads."),
    ];
    let py = python(&specs, "ZCODE_TOOLS_SOCKET", "ZCODE_TOOLS_TOKEN");
    assert!(
        py.contains("_groups[\"fs\"] = _Group(\"fs\", {\n    \"list_files\": _tool(\"fs.list_files\", \"list_files\", "),
        "{py}"
    );
    assert!(py.contains("path (string required): where"), "{py}");
    let ts = node_types(&specs);
    assert!(
        ts.contains("list_files(args: { \"path\": string; \"n\"?: number }): Promise<unknown>;"),
        "{ts}"
    );
    let esm = node_esm(&specs, "ZCODE_TOOLS_SOCKET", "ZCODE_TOOLS_TOKEN");
    assert!(esm.contains("export { __zc_g_fs as fs };"), "{esm}");
    let cjs = node_cjs(&specs, "ZCODE_TOOLS_SOCKET", "ZCODE_TOOLS_TOKEN");
    assert!(
        cjs.contains("module.exports = { ToolError, call, result, log, fs: __zc_g_fs };"),
        "{cjs}"
    );
}
