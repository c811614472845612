//! The one way paths enter a Seatbelt profile. SBPL is Scheme: a path is
//! either a string literal or part of a regex literal; both are built here
//! and nowhere else, so an odd file name cannot end a literal early and
//! inject rules.

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuoteError {
    #[error("the path {0:?} is not UTF-8; Seatbelt profiles cannot name it")]
    NotUtf8(String),
    #[error("the path {0:?} contains a control character; refusing to put it in a profile")]
    Control(String),
    #[error("the path {0:?} contains a double quote, which a Seatbelt regex cannot hold")]
    QuoteInRegex(String),
}

fn checked(path: &std::path::Path) -> Result<&str, QuoteError> {
    let s = path
        .to_str()
        .ok_or_else(|| QuoteError::NotUtf8(path.to_string_lossy().into_owned()))?;
    if s.chars().any(char::is_control) {
        return Err(QuoteError::Control(s.to_owned()));
    }
    Ok(s)
}

/// A path as an SBPL string literal, quotes included.
pub fn string(path: &std::path::Path) -> Result<String, QuoteError> {
    let s = checked(path)?;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(out)
}

/// A path as a regex fragment matching exactly that text (for use inside
/// an SBPL `#"..."` literal, which takes backslashes as they are).
pub fn regex_literal(path: &std::path::Path) -> Result<String, QuoteError> {
    let s = checked(path)?;
    if s.contains('"') {
        return Err(QuoteError::QuoteInRegex(s.to_owned()));
    }
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        if "\\.^$|?*+()[]{}".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn strings_escape_quotes_and_backslashes() {
        assert_eq!(string(Path::new("/a b/c")).unwrap(), r#""/a b/c""#);
        assert_eq!(
            string(Path::new(r#"/x")(allow file-write*"#)).unwrap(),
            r#""/x\")(allow file-write*""#
        );
        assert_eq!(string(Path::new(r"/a\b")).unwrap(), r#""/a\\b""#);
    }

    #[test]
    fn control_characters_and_non_utf8_are_refused() {
        assert!(matches!(
            string(Path::new("/a\nb")),
            Err(QuoteError::Control(_))
        ));
        use std::os::unix::ffi::OsStrExt;
        let bad = std::ffi::OsStr::from_bytes(b"/a\xffb");
        assert!(matches!(
            string(Path::new(bad)),
            Err(QuoteError::NotUtf8(_))
        ));
    }

    #[test]
    fn regex_literals_match_only_themselves() {
        let lit = regex_literal(Path::new("/Users/a.b/(x)[1]+$")).unwrap();
        let re = regex::Regex::new(&format!("^{lit}$")).unwrap();
        assert!(re.is_match("/Users/a.b/(x)[1]+$"));
        assert!(!re.is_match("/Users/aXb/(x)[1]+$"));
        assert!(matches!(
            regex_literal(Path::new("/a\"b")),
            Err(QuoteError::QuoteInRegex(_))
        ));
    }
}
