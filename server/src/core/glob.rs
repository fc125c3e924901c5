//! Resource id globs, as templates' `identifier_glob`s and policies' `resources` write them:
//! globset's syntax, with `*` matching `/` too.

use globset::{Glob, GlobBuilder};

/// A resource id glob as `identifier_glob`s are written: `*` matches `/` too.
pub fn glob(pattern: &str) -> Result<Glob, String> {
    let glob = GlobBuilder::new(pattern).literal_separator(false).backslash_escape(true).build();
    // The error quotes the character the glob choked on, which may be a line break.
    glob.map_err(|e| format!("malformed glob: {}", e.kind()).replace('\n', "\\n").replace('\r', "\\r"))
}
