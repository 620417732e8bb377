//! Cutting an SSE byte stream into lines, chunk by chunk: the part the
//! parser and the framing scanner share. Any of `\n`, `\r\n` and `\r` ends
//! a line, even when a chunk ends between the `\r` and its `\n`, and a BOM
//! at the very start of the stream is dropped, even when split over chunks.

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// A piece of the current line.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Piece<'a> {
    /// Bytes of a line whose end has not arrived yet.
    Partial(&'a [u8]),
    /// The last bytes of a line (possibly none), which ends here.
    End(&'a [u8]),
}

/// The splitter's state between chunks.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lines {
    /// The last byte seen was `\r`; a `\n` right after it ends nothing.
    after_cr: bool,
    /// How many BOM bytes matched at the stream start; `None` once decided.
    bom_matched: Option<usize>,
}

impl Default for Lines {
    fn default() -> Self {
        Lines { after_cr: false, bom_matched: Some(0) }
    }
}

impl Lines {
    /// Whether the stream so far is the start of a BOM, not yet decided.
    pub(super) fn in_bom(&self) -> bool {
        self.bom_matched.is_some_and(|m| m > 0)
    }

    /// Cuts `chunk`, handing every piece to `f` in order.
    pub(super) fn split(&mut self, chunk: &[u8], mut f: impl FnMut(Piece<'_>)) {
        let mut rest = chunk;
        if let Some(mut matched) = self.bom_matched {
            loop {
                let Some(&byte) = rest.first() else {
                    self.bom_matched = Some(matched);
                    return;
                };
                if BOM.get(matched) != Some(&byte) {
                    // Not a BOM: what matched so far is content (it holds
                    // no line break).
                    self.bom_matched = None;
                    if matched > 0 {
                        f(Piece::Partial(&BOM[..matched]));
                    }
                    break;
                }
                matched += 1;
                rest = &rest[1..];
                if matched == BOM.len() {
                    self.bom_matched = None;
                    break;
                }
            }
        }
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match memchr::memchr2(b'\n', b'\r', rest) {
                None => {
                    f(Piece::Partial(rest));
                    break;
                }
                Some(at) => {
                    f(Piece::End(&rest[..at]));
                    self.after_cr = rest[at] == b'\r';
                    rest = &rest[at + 1..];
                }
            }
        }
    }
}
