//! A forgiving scan of JSON text that may still be growing (a model's output, token by
//! token): where an object's members and values start and end, so calls can be read
//! before the text is whole.

/// A JSON object as scanned so far: its members' keys and value spans.
pub(super) struct ObjectScan {
    /// (key, value start, value end once complete).
    members: Vec<(String, usize, Option<usize>)>,
    /// One past its `}`, once complete.
    pub(super) end: Option<usize>,
}

impl ObjectScan {
    pub(super) fn member(&self, key: &str) -> Option<(usize, Option<usize>)> {
        self.members
            .iter()
            .find(|m| m.0 == key)
            .map(|&(_, s, e)| (s, e))
    }
}

pub(super) fn skip_ws(text: &str, mut i: usize) -> usize {
    let b = text.as_bytes();
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The object at `text[i]`, as far as it is written; `None` if no `{` is there.
pub(super) fn scan_object(text: &str, i: usize) -> Option<ObjectScan> {
    let b = text.as_bytes();
    if b.get(i) != Some(&b'{') {
        return None;
    }
    let mut obj = ObjectScan {
        members: Vec::new(),
        end: None,
    };
    let mut j = skip_ws(text, i + 1);
    if b.get(j) == Some(&b'}') {
        obj.end = Some(j + 1);
        return Some(obj);
    }
    loop {
        if b.get(j) != Some(&b'"') {
            return Some(obj);
        }
        let Some(k_end) = string_end(b, j) else {
            return Some(obj);
        };
        let Ok(key) = serde_json::from_str::<String>(&text[j..k_end]) else {
            return Some(obj);
        };
        j = skip_ws(text, k_end);
        if b.get(j) != Some(&b':') {
            return Some(obj);
        }
        let start = skip_ws(text, j + 1);
        let end = if start < b.len() {
            value_end(text, start)
        } else {
            None
        };
        obj.members.push((key, start, end));
        let Some(end) = end else {
            return Some(obj);
        };
        j = skip_ws(text, end);
        match b.get(j) {
            Some(b',') => j = skip_ws(text, j + 1),
            Some(b'}') => {
                obj.end = Some(j + 1);
                return Some(obj);
            }
            _ => return Some(obj),
        }
    }
}

/// One past the JSON string at `b[i]` (`"`), if it is closed.
pub(super) fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// One past the JSON value at `text[i]`, if it is complete (a number or literal is
/// complete once something follows it).
pub(super) fn value_end(text: &str, i: usize) -> Option<usize> {
    let b = text.as_bytes();
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let n = b[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))?;
            Some(i + n)
        }
    }
}
