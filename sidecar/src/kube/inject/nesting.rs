//! A pass over YAML text, before the parser sees it, that refuses flow collections (`[...]`,
//! `{...}`) nested deeper than a limit. The parser (libyaml) walks its stack of flow levels for
//! every token, so its time grows with the square of the nesting: a 500 KB `{a: {a: ...}}`
//! took minutes before the deserializer's depth limit refused it. This pass takes one.
//!
//! It follows libyaml's lexical rules for what can hide a bracket: quoted scalars, plain
//! scalars, comments, block scalars, tags and anchors. Where the end of a plain or block scalar
//! depends on indentation that only the parser tracks, it follows every way the parser may read
//! the text at once (as a set of readings, merged where equal), so the depth it finds is never
//! below the parser's: hiding brackets from it takes a reading it does not follow.

/// What a reading is in the middle of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Between tokens.
    Token,
    /// A plain scalar; `blank` after white space, where `#` starts a comment.
    Plain {
        blank: bool,
    },
    Single,
    Double,
    /// The character after `\` in a double-quoted scalar, or the second `'` of `''`.
    Escaped {
        double: bool,
    },
    /// A comment or a directive, to the end of the line.
    Comment,
    /// An anchor's or alias's name.
    Name,
    Tag,
    /// A block scalar's header line (`|`, `>` and its indicators).
    Header,
    /// A block scalar's content.
    Block,
    /// The rest of a document marker (`---`, `...`).
    Marker {
        left: u8,
    },
}

impl Mode {
    const COUNT: usize = 14;

    fn index(self) -> usize {
        match self {
            Mode::Token => 0,
            Mode::Plain { blank } => 1 + usize::from(blank),
            Mode::Single => 3,
            Mode::Double => 4,
            Mode::Escaped { double } => 5 + usize::from(double),
            Mode::Comment => 7,
            Mode::Name => 8,
            Mode::Tag => 9,
            Mode::Header => 10,
            Mode::Block => 11,
            Mode::Marker { left } => 12 + usize::from(left > 1),
        }
    }
}

/// One way of reading the text so far: what it is in, and how deep in flow collections.
#[derive(Clone, Copy)]
struct Reading {
    mode: Mode,
    depth: usize,
}

/// Where one character stands.
struct At<'a> {
    /// The text from the character on.
    rest: &'a str,
    next: Option<char>,
    line_start: bool,
}

impl At<'_> {
    /// The next character ends a token: white space, a line break, or the end.
    fn next_blank(&self) -> bool {
        self.next.is_none_or(|c| c == ' ' || c == '\t' || is_break(c))
    }

    /// A document marker starts here.
    fn marker(&self) -> bool {
        self.line_start
            && (self.rest.starts_with("---") || self.rest.starts_with("..."))
            && self.rest[3..].chars().next().is_none_or(|c| c == ' ' || c == '\t' || is_break(c))
    }
}

/// libyaml's line breaks.
fn is_break(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

/// `Err` naming the line where flow collections may nest more than `limit` deep.
pub fn check(text: &str, limit: usize) -> Result<(), String> {
    let slots = Mode::COUNT.saturating_mul(limit.saturating_add(1));
    // The character (plus one) at which each (mode, depth) was last added: merges in O(1).
    let mut added = vec![0usize; slots];
    let mut readings = vec![Reading { mode: Mode::Token, depth: 0 }];
    let mut next_readings = Vec::new();
    let (mut line, mut line_start) = (1usize, true);
    let mut chars = text.char_indices().peekable();
    let mut count = 0usize;
    while let Some((i, c)) = chars.next() {
        count += 1;
        let at = At { rest: &text[i..], next: chars.peek().map(|&(_, c)| c), line_start };
        let mut too_deep = false;
        let mut add = |reading: Reading| {
            if reading.depth > limit {
                too_deep = true;
            } else {
                let slot = reading.mode.index() * limit.saturating_add(1) + reading.depth;
                if added[slot] != count {
                    added[slot] = count;
                    next_readings.push(reading);
                }
            }
        };
        for &reading in &readings {
            step(reading, c, &at, &mut add);
        }
        if too_deep {
            return Err(format!("line {line}: [ ] and {{ }} nested more than {limit} deep"));
        }
        std::mem::swap(&mut readings, &mut next_readings);
        next_readings.clear();
        line_start = is_break(c);
        // \r\n is one break.
        if line_start && !(c == '\r' && at.next == Some('\n')) {
            line += 1;
        }
    }
    Ok(())
}

/// What `reading` becomes past `c`.
fn step(reading: Reading, c: char, at: &At, add: &mut impl FnMut(Reading)) {
    let Reading { mode, depth } = reading;
    let to = |mode| Reading { mode, depth };
    match mode {
        Mode::Token => token(depth, c, at, add),
        Mode::Plain { blank } => {
            let ends = at.marker()
                || (blank && c == '#')
                || (c == ':' && at.next_blank())
                || (depth > 0 && matches!(c, ',' | '[' | ']' | '{' | '}'));
            if ends {
                token(depth, c, at, add);
            } else if is_break(c) {
                // In a block, the next line continues the scalar if it is indented past the
                // parser's current indentation: both.
                add(to(Mode::Plain { blank: true }));
                if depth == 0 {
                    add(to(Mode::Token));
                }
            } else {
                add(to(Mode::Plain { blank: c == ' ' || c == '\t' }));
            }
        }
        Mode::Single if c == '\'' => {
            add(to(if at.next == Some('\'') { Mode::Escaped { double: false } } else { Mode::Token }))
        }
        Mode::Double if c == '\\' => add(to(Mode::Escaped { double: true })),
        Mode::Double if c == '"' => add(to(Mode::Token)),
        Mode::Single | Mode::Double => add(reading),
        Mode::Escaped { double } => add(to(if double { Mode::Double } else { Mode::Single })),
        Mode::Comment => add(to(if is_break(c) { Mode::Token } else { Mode::Comment })),
        Mode::Name if c.is_ascii_alphanumeric() || c == '-' || c == '_' => add(reading),
        Mode::Tag if !(c == ' ' || c == '\t' || is_break(c) || (depth > 0 && c == ',')) => add(reading),
        Mode::Name | Mode::Tag => token(depth, c, at, add),
        Mode::Header | Mode::Block if is_break(c) => {
            // The content ends at the first line indented less than it, which needs the
            // parser's indentation to tell: each line may be content or the next token.
            add(to(Mode::Block));
            add(to(Mode::Token));
        }
        Mode::Header => add(reading),
        // Content is indented at least one column: a line starting with anything else has
        // ended it (the reading at the line's start takes over).
        Mode::Block if at.line_start && c != ' ' => {}
        Mode::Block => add(reading),
        Mode::Marker { left } => add(to(if left > 1 { Mode::Marker { left: left - 1 } } else { Mode::Token })),
    }
}

/// What a reading between tokens becomes past `c`, by libyaml's `fetch_next_token`.
fn token(depth: usize, c: char, at: &At, add: &mut impl FnMut(Reading)) {
    let mode = match c {
        _ if at.marker() => Mode::Marker { left: 2 },
        '%' if at.line_start => Mode::Comment,
        '[' | '{' => return add(Reading { mode: Mode::Token, depth: depth.saturating_add(1) }),
        ']' | '}' => return add(Reading { mode: Mode::Token, depth: depth.saturating_sub(1) }),
        ' ' | '\t' | ',' => Mode::Token,
        '\u{feff}' if at.line_start => Mode::Token,
        _ if is_break(c) => Mode::Token,
        '#' => Mode::Comment,
        '-' if at.next_blank() => Mode::Token,
        '?' | ':' if depth > 0 || at.next_blank() => Mode::Token,
        '*' | '&' => Mode::Name,
        '!' => Mode::Tag,
        '|' | '>' if depth == 0 => Mode::Header,
        '\'' => Mode::Single,
        '"' => Mode::Double,
        // Characters the parser refuses to start a token with read as a plain scalar: that
        // reading is as deep as any other.
        _ => Mode::Plain { blank: false },
    };
    add(Reading { mode, depth });
}
