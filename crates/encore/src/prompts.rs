//! Where `generate`'s prompts come from: `--prompt TEXT` (repeatable; `--prompt -` reads
//! one prompt from standard input) and `--prompt-file FILE` (one prompt per line; blank
//! lines are skipped; a line starting with `{` is JSON with a string field `prompt`, as
//! in a JSONL file).

use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// The prompts in order: every `--prompt`, then the file's. `read_stdin` is called for
/// `-` (at most once).
pub fn collect(
    prompts: &[String],
    file: Option<&Path>,
    read_stdin: impl FnOnce() -> std::io::Result<String>,
) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(prompts.len());
    let mut read_stdin = Some(read_stdin);
    for p in prompts {
        if p == "-" {
            let Some(read) = read_stdin.take() else {
                bail!("--prompt -: standard input can be read only once");
            };
            let text = read().context("--prompt -: reading standard input")?;
            out.push(strip_newline(&text).to_string());
        } else {
            out.push(p.clone());
        }
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--prompt-file `{}`", path.display()))?;
        let from_file = parse_file(path, &text)?;
        if from_file.is_empty() {
            bail!("--prompt-file `{}` holds no prompts", path.display());
        }
        out.extend(from_file);
    }
    Ok(out)
}

/// Standard input, whole.
pub fn read_stdin() -> std::io::Result<String> {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s)?;
    Ok(s)
}

fn strip_newline(s: &str) -> &str {
    let s = s.strip_suffix('\n').unwrap_or(s);
    s.strip_suffix('\r').unwrap_or(s)
}

/// One prompt per non-blank line; JSON lines give their `prompt` field.
fn parse_file(path: &Path, text: &str) -> Result<Vec<String>> {
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        if !line.trim_start().starts_with('{') {
            prompts.push(line.to_string());
            continue;
        }
        let at = || format!("--prompt-file `{}` line {}", path.display(), i + 1);
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| anyhow::anyhow!("{}: not valid JSON: {e}", at()))?;
        match v.get("prompt") {
            Some(serde_json::Value::String(p)) => prompts.push(p.clone()),
            Some(_) => bail!("{}: field `prompt` is not a string", at()),
            None => bail!("{}: missing field `prompt`", at()),
        }
    }
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> Result<Vec<String>> {
        parse_file(Path::new("p.txt"), text)
    }

    #[test]
    fn lines_jsonl_and_blank_lines() {
        let got = file("one\n\n  \n{\"prompt\": \"two\\nlines\", \"id\": 3}\r\nthree\r\n").unwrap();
        assert_eq!(got, ["one", "two\nlines", "three"]);
        let e = file("a\n{\"prompt\": \n").unwrap_err().to_string();
        assert!(e.contains("`p.txt` line 2: not valid JSON"), "{e}");
        let e = file("{\"text\": \"x\"}").unwrap_err().to_string();
        assert!(e.contains("line 1: missing field `prompt`"), "{e}");
        let e = file("\n{\"prompt\": 5}").unwrap_err().to_string();
        assert!(e.contains("line 2: field `prompt` is not a string"), "{e}");
    }

    #[test]
    fn stdin_is_read_once_for_dash() {
        let args = ["a".to_string(), "-".to_string()];
        let got = collect(&args, None, || Ok("from stdin\n".into())).unwrap();
        assert_eq!(got, ["a", "from stdin"]);
        let twice = ["-".to_string(), "-".to_string()];
        assert!(collect(&twice, None, || Ok(String::new())).is_err());
        let e = collect(&[], Some(Path::new("/no/such/file")), || Ok(String::new())).unwrap_err();
        assert!(format!("{e:#}").contains("`/no/such/file`"), "{e:#}");
    }
}
