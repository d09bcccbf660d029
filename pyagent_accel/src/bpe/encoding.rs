//! Steps 1, 3 and 4 of `pyagent_ref.tokenize.bpe` on `&str`, and decoding.
//!
//! Step 2 (Unicode normal forms) is not here: the Python layer runs the reference's
//! `_split_and_normalize` for an encoding that normalizes, so the tables of Python's
//! `unicodedata` stay the one source of normal forms, and hands the text segments over.

use aho_corasick::{AhoCorasick, MatchKind};
use fancy_regex::Regex;
use rustc_hash::FxHashMap;

use super::merge::{MergeTable, Merger};

/// A part of the input after step 1: text still to encode, or an added token's id.
enum Segment<'t> {
    Text(&'t str),
    Id(u32),
}

/// The added tokens one call matches, and the special tokens it must not meet.
///
/// Contract of `split_added_tokens`, applied once per pass: scanning left to right,
/// the leftmost occurrence wins and, of several starting there, the longest. The
/// reference runs two passes, raw tokens then `normalized` ones; without normal forms
/// the second pass looks for the normalized tokens' text in the gaps of the first.
pub struct AddedTokenSplitter {
    passes: Vec<(AhoCorasick, Vec<u32>)>,
    disallowed: AhoCorasick,
}

impl AddedTokenSplitter {
    /// `passes`: for each pass, the (text, id) of the tokens it matches; `disallowed`:
    /// the special tokens whose presence in a text is an error.
    pub fn new(passes: Vec<Vec<(String, u32)>>, disallowed: Vec<String>) -> Result<Self, String> {
        let leftmost_longest = |texts: &[&str]| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(texts)
                .map_err(|e| e.to_string())
        };
        let passes = passes
            .into_iter()
            .filter(|tokens| !tokens.is_empty())
            .map(|tokens| {
                let texts: Vec<&str> = tokens.iter().map(|(t, _)| t.as_str()).collect();
                let ids = tokens.iter().map(|&(_, id)| id).collect();
                Ok((leftmost_longest(&texts)?, ids))
            })
            .collect::<Result<_, String>>()?;
        let disallowed = AhoCorasick::new(&disallowed).map_err(|e| e.to_string())?;
        Ok(AddedTokenSplitter { passes, disallowed })
    }

    /// Whether a disallowed special token occurs anywhere in `text`.
    pub fn meets_disallowed(&self, text: &str) -> bool {
        self.disallowed.is_match(text)
    }

    /// Step 1: `text` cut at every added token of every pass, empty text dropped.
    fn split<'t>(&self, text: &'t str) -> Vec<Segment<'t>> {
        let mut segments = vec![Segment::Text(text)];
        for (finder, ids) in &self.passes {
            let mut out = Vec::with_capacity(segments.len());
            for segment in segments {
                let Segment::Text(text) = segment else {
                    out.push(segment);
                    continue;
                };
                let mut start = 0;
                for found in finder.find_iter(text) {
                    out.push(Segment::Text(&text[start..found.start()]));
                    out.push(Segment::Id(ids[found.pattern().as_usize()]));
                    start = found.end();
                }
                out.push(Segment::Text(&text[start..]));
            }
            segments = out;
        }
        segments.retain(|s| !matches!(s, Segment::Text("")));
        segments
    }
}

/// What `BytePairEncoding` holds for steps 3 and 4, and the bytes of every id.
pub struct Encoding {
    vocab: FxHashMap<Vec<u8>, u32>,
    byte_ids: [u32; 256],
    merges: MergeTable,
    patterns: Vec<Regex>,
    add_prefix_space: bool,
    ignore_merges: bool,
    /// id -> the bytes `decode` writes, None for an id of no token.
    id_bytes: Vec<Option<Vec<u8>>>,
}

/// A pre-tokenization regex that failed on a text (fancy-regex's backtracking limit).
#[derive(Debug)]
pub struct RegexError(pub String);

impl Encoding {
    /// The encoding of validated data (`BytePairEncoding.__init__` checked it): `vocab`
    /// holds every single byte; each merge's left and right are tokens, ranked by
    /// `rank` and merging into the token of their concatenation; `decoded` is
    /// (id, bytes) for every id, added tokens included.
    pub fn new(
        vocab: FxHashMap<Vec<u8>, u32>,
        merges: Vec<(Vec<u8>, Vec<u8>, u32)>,
        patterns: &[String],
        add_prefix_space: bool,
        ignore_merges: bool,
        decoded: Vec<(u32, Vec<u8>)>,
    ) -> Result<Self, String> {
        let mut byte_ids = [0; 256];
        for (b, id) in byte_ids.iter_mut().enumerate() {
            *id = *vocab
                .get(&[b as u8][..])
                .ok_or("vocab lacks a single byte")?;
        }
        // A merge whose sides are not both tokens never applies: parts are tokens.
        let merges = MergeTable::new(merges.into_iter().filter_map(|(left, right, rank)| {
            let merged = *vocab.get(&[&left[..], &right[..]].concat())?;
            Some((*vocab.get(&left)?, *vocab.get(&right)?, rank, merged))
        }));
        let patterns = patterns
            .iter()
            .map(|p| Regex::new(p).map_err(|e| format!("pattern {p:?}: {e}")))
            .collect::<Result<_, _>>()?;
        let size = decoded
            .iter()
            .map(|&(id, _)| id as usize + 1)
            .max()
            .unwrap_or(0);
        let mut id_bytes = vec![None; size];
        for (id, bytes) in decoded {
            id_bytes[id as usize] = Some(bytes);
        }
        Ok(Encoding {
            vocab,
            byte_ids,
            merges,
            patterns,
            add_prefix_space,
            ignore_merges,
            id_bytes,
        })
    }

    /// The ids of `text` (steps 1, 3, 4); `text` holds no disallowed special token.
    pub fn encode(
        &self,
        text: &str,
        splitter: &AddedTokenSplitter,
    ) -> Result<Vec<u32>, RegexError> {
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut merger = Merger::default();
        for segment in splitter.split(text) {
            match segment {
                Segment::Id(id) => ids.push(id),
                Segment::Text(text) => self.encode_text(text, &mut merger, &mut ids)?,
            }
        }
        Ok(ids)
    }

    /// Steps 3 and 4 on text that holds no added token, appended to `ids`.
    fn encode_text(
        &self,
        text: &str,
        merger: &mut Merger,
        ids: &mut Vec<u32>,
    ) -> Result<(), RegexError> {
        let prefixed;
        let text = if self.add_prefix_space && !text.starts_with(' ') {
            prefixed = format!(" {text}");
            &prefixed
        } else {
            text
        };
        let mut pieces = vec![text];
        for pattern in &self.patterns {
            let mut out = Vec::with_capacity(pieces.len());
            for piece in pieces {
                split_isolated(piece, pattern, &mut out)?;
            }
            pieces = out;
        }
        for piece in pieces {
            self.encode_piece(piece.as_bytes(), merger, ids);
        }
        Ok(())
    }

    /// The ids of one piece: the piece itself if it is a token and `ignore_merges`,
    /// else the tokens of the byte-pair merge.
    fn encode_piece(&self, piece: &[u8], merger: &mut Merger, ids: &mut Vec<u32>) {
        if self.ignore_merges {
            if let Some(&id) = self.vocab.get(piece) {
                ids.push(id);
                return;
            }
        }
        merger.merge(piece, &self.byte_ids, &self.merges, ids);
    }

    /// The text of `ids`: their bytes joined and decoded as UTF-8, each maximal invalid
    /// sequence replaced by one U+FFFD (as Python's `errors="replace"`); None if an id is
    /// of no token (the Python layer then raises the reference's error).
    pub fn decode(&self, ids: &[u32]) -> Option<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.id_bytes.get(id as usize)?.as_deref()?);
        }
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// `split_isolated`: `text` cut into the matches of `pattern` and the non-empty gaps
/// between them, in order, appended to `out`.
fn split_isolated<'t>(
    text: &'t str,
    pattern: &Regex,
    out: &mut Vec<&'t str>,
) -> Result<(), RegexError> {
    let mut start = 0;
    for found in pattern.find_iter(text) {
        let found =
            found.map_err(|e| RegexError(format!("pattern {:?}: {e}", pattern.as_str())))?;
        out.extend(
            [&text[start..found.start()], found.as_str()]
                .into_iter()
                .filter(|p| !p.is_empty()),
        );
        start = found.end();
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    Ok(())
}
