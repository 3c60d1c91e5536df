//! Stop strings on streamed text (`StopMatcher`): matches split across pieces, multi-byte
//! characters, several stops (the first to complete wins), overlapping prefixes, what is
//! held back and when it is released, and the byte tokenizer's stream decoder feeding it.

use encore_core::tokenizer::{StopMatcher, StopOutput, StreamDecoder, Tokenizer};

/// Push every piece; returns the released pieces, whether a stop matched, and the text
/// `finish` releases at the end.
fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
    let mut m = StopMatcher::new(stops.iter().copied()).unwrap();
    let mut out = Vec::new();
    let mut stopped = false;
    for p in pieces {
        let o = m.push(p);
        out.push(o.text);
        stopped |= o.stopped;
        assert_eq!(m.stopped(), stopped);
    }
    (out, stopped, m.finish())
}

#[test]
fn a_stop_split_across_pieces_is_found_and_not_returned() {
    let (out, stopped, rest) = run(&["o w"], &["Hel", "lo", " wo", "rld"]);
    // "Hel" cannot start "o w"; "lo": the "o" could; " wo" completes the match.
    assert_eq!(out, ["Hel", "l", "", ""]);
    assert!(stopped);
    assert_eq!(rest, "");
}

#[test]
fn only_a_possible_start_is_held_and_released_when_it_cannot_match() {
    let mut m = StopMatcher::new(["xyz"]).unwrap();
    assert_eq!(m.push("ax").text, "a");
    // "xbx": "xb" can no longer start "xyz", the last "x" can.
    assert_eq!(m.push("bx").text, "xb");
    assert_eq!(m.push("y").text, "");
    assert_eq!(m.push("q").text, "xyq");
    assert!(!m.stopped());
    assert_eq!(m.finish(), "");
    // The text ended mid-candidate: finish releases it.
    assert_eq!(m.push("xy").text, "");
    assert_eq!(m.finish(), "xy");
    assert_eq!(m.finish(), "");
}

#[test]
fn multi_byte_characters_are_never_cut() {
    // "é" (2 bytes) starts the stop "é!": held whole, then dropped with the match.
    let (out, stopped, _) = run(&["é!"], &["caf", "é", "!x"]);
    assert_eq!(out, ["caf", "", ""]);
    assert!(stopped);
    // "é" then something else: released whole.
    let (out, stopped, rest) = run(&["é!"], &["café", "?"]);
    assert_eq!(out, ["caf", "é?"]);
    assert!(!stopped);
    assert_eq!(rest, "");
    // A 3-byte stop sharing its first byte with another 3-byte character (€ = E2 82 AC,
    // ‚ = E2 80 9A): bytes in common are not a character prefix.
    let (out, stopped, _) = run(&["€"], &["1‚", "2€3"]);
    assert_eq!(out, ["1‚", "2"]);
    assert!(stopped);
    for piece in out {
        assert!(!piece.contains('\u{FFFD}'));
    }
}

#[test]
fn the_stop_completed_first_wins() {
    let (out, stopped, _) = run(&["world", "lo"], &["hello world"]);
    assert_eq!(out, ["hel"]);
    assert!(stopped);
    // The later-listed stop occurs first.
    let (out, _, _) = run(&["d!", "wor"], &["hello ", "world!"]);
    assert_eq!(out.concat(), "hello ");
    // Two stops matching at the same place: either gives the same text.
    let (out, _, _) = run(&["ab", "abc"], &["xxab", "c"]);
    assert_eq!(out.concat(), "xx");
    // A short stop completing inside a longer one that began earlier: the text would have
    // stopped there had it arrived a character at a time, so it does in one piece too.
    let (out, _, _) = run(&["ab€b", "b"], &["ab€b"]);
    assert_eq!(out.concat(), "a");
    // Two stops completing at the same character: the longer one (earlier start) wins.
    let (out, _, _) = run(&["b", "ab"], &["xab"]);
    assert_eq!(out.concat(), "x");
}

#[test]
fn overlapping_prefixes_keep_the_longest_candidate() {
    // After "abcabc" only the second "abc" can start "abcabd".
    let (out, stopped, _) = run(&["abcabd"], &["abcab", "c", "abd", "zzz"]);
    assert_eq!(out, ["", "abc", "", ""]);
    assert!(stopped);
    // A stop that is a prefix of another: the shorter one matches first.
    let (out, stopped, _) = run(&["aaa", "aa"], &["b", "a", "a"]);
    assert_eq!(out, ["b", "", ""]);
    assert!(stopped);
}

#[test]
fn nothing_follows_a_stop_and_no_stops_pass_everything() {
    let mut m = StopMatcher::new(["."]).unwrap();
    assert_eq!(
        m.push("one. two"),
        StopOutput {
            text: "one".into(),
            stopped: true
        }
    );
    assert_eq!(m.push("three").text, "");
    assert!(m.push("three").stopped);
    assert_eq!(m.finish(), "");
    let mut none = StopMatcher::new(Vec::<String>::new()).unwrap();
    assert!(none.is_empty());
    assert_eq!(none.push("anything at all").text, "anything at all");
    assert_eq!(none.finish(), "");
}

#[test]
fn an_empty_stop_string_is_an_error_naming_stop() {
    let e = StopMatcher::new(["ok", ""]).unwrap_err().to_string();
    assert!(e.contains("stop"), "{e}");
}

/// A small deterministic generator (no rand dependency in core's tests).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

#[test]
fn random_texts_split_at_random_equal_the_first_match_reference() {
    let alphabet = ['a', 'b', 'é', '€', ' '];
    let mut rng = Lcg(7);
    let word = |rng: &mut Lcg, len: usize| -> String {
        (0..len)
            .map(|_| alphabet[rng.next(alphabet.len())])
            .collect()
    };
    for case in 0..2000 {
        let len = 1 + rng.next(24);
        let text = word(&mut rng, len);
        let stops: Vec<String> = (0..1 + rng.next(4))
            .map(|_| {
                let len = 1 + rng.next(4);
                word(&mut rng, len)
            })
            .collect();
        // Random split at character boundaries.
        let chars: Vec<char> = text.chars().collect();
        let mut pieces = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let n = 1 + rng.next(4);
            pieces.push(
                chars[i..(i + n).min(chars.len())]
                    .iter()
                    .collect::<String>(),
            );
            i += n;
        }
        // Reference: the shortest prefix of the text that ends with a stop string; the
        // text before the longest stop string it ends with.
        let first = text
            .char_indices()
            .map(|(i, c)| i + c.len_utf8())
            .find_map(|end| {
                let prefix = &text[..end];
                stops
                    .iter()
                    .filter(|s| prefix.ends_with(s.as_str()))
                    .map(|s| end - s.len())
                    .min()
            });
        let expected = first.map_or(text.as_str(), |at| &text[..at]);
        let mut m = StopMatcher::new(stops.clone()).unwrap();
        let mut released = String::new();
        let mut arrived = 0;
        for p in &pieces {
            arrived += p.len();
            let o = m.push(p);
            released.push_str(&o.text);
            assert!(
                expected.starts_with(&released),
                "case {case}: released {released:?} is not a prefix of {expected:?} (text {text:?} stops {stops:?} pieces {pieces:?})"
            );
            // Only a possible start of a stop string is held back: at most the longest
            // stop string less one character of what arrived so far.
            if !m.stopped() {
                let longest = stops.iter().map(String::len).max().unwrap();
                assert!(
                    arrived - released.len() < longest,
                    "case {case}: held too much"
                );
            }
        }
        if !m.stopped() {
            released.push_str(&m.finish());
        }
        assert_eq!(
            released, expected,
            "case {case}: text {text:?} stops {stops:?} pieces {pieces:?}"
        );
        assert_eq!(m.stopped(), first.is_some(), "case {case}");
    }
}

#[test]
fn byte_tokens_through_the_stream_decoder_stop_before_a_multi_byte_stop() {
    // The byte tokenizer emits one byte per id, so "é" and "€" arrive split across ids;
    // the stream decoder waits for whole characters and the matcher never cuts one.
    let tok = Tokenizer::bytes();
    let text = "naïve café €5, then more";
    let ids: Vec<u32> = text.bytes().map(u32::from).collect();
    let mut dec = StreamDecoder::new(&tok, &[]);
    let mut m = StopMatcher::new(["é €"]).unwrap();
    let mut released = String::new();
    let mut stopped_at = None;
    for (i, &id) in ids.iter().enumerate() {
        let Some(piece) = dec.push(id).unwrap() else {
            continue;
        };
        let o = m.push(&piece);
        assert!(
            !o.text.contains('\u{FFFD}'),
            "a cut character: {:?}",
            o.text
        );
        released.push_str(&o.text);
        if o.stopped {
            stopped_at = Some(i);
            break;
        }
    }
    assert_eq!(released, "naïve caf");
    // It stopped on the last byte of "€", not later.
    assert_eq!(
        stopped_at,
        Some(text.find('€').unwrap() + '€'.len_utf8() - 1)
    );
}

#[test]
fn the_stop_that_ended_the_text_is_named() {
    let mut m = StopMatcher::new(["world", "lo w", "z"]).unwrap();
    assert_eq!(m.matched(), None);
    assert_eq!(m.push("Hel").text, "He");
    assert_eq!(m.matched(), None);
    // "lo w" completes before "world" does.
    assert!(m.push("lo world").stopped);
    assert_eq!(m.matched(), Some("lo w"));
    let mut none = StopMatcher::new(["z"]).unwrap();
    none.push("abc");
    none.finish();
    assert_eq!(none.matched(), None);
}
