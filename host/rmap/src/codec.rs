//! Netstrings (`len:bytes,`), the format of change messages and list
//! values, mirroring the Lua helpers of `lua/prelude.lua` byte for byte.

/// Appends `field` to `out` as one netstring. The one netstring codec of
/// the project: the pool's inbox and reply messages use it too.
pub fn push_netstring(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(field.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(field);
    out.push(b',');
}

/// The bytes [`push_netstring`] appends for a field of `len` bytes.
pub fn netstring_len(len: usize) -> usize {
    len.to_string().len() + 2 + len
}

/// The consecutive netstrings of `bytes`; `None` when malformed.
pub fn netstrings(mut bytes: &[u8]) -> Option<Vec<&[u8]>> {
    let mut fields = Vec::new();
    while !bytes.is_empty() {
        let (field, tail) = split_netstring(bytes)?;
        fields.push(field);
        bytes = tail;
    }
    Some(fields)
}

/// Encodes `items` as consecutive netstrings: the list format of map values.
pub fn encode_list<S: AsRef<str>>(items: &[S]) -> String {
    let mut out = Vec::new();
    for item in items {
        push_netstring(&mut out, item.as_ref().as_bytes());
    }
    // Netstrings of UTF-8 text are UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// Decodes a list value; `None` when it is not a sequence of netstrings.
pub fn decode_list(value: &str) -> Option<Vec<String>> {
    netstrings(value.as_bytes())?.into_iter().map(|item| String::from_utf8(item.to_vec()).ok()).collect()
}

/// Splits one netstring off the front of `bytes`.
pub(crate) fn split_netstring(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let colon = bytes.iter().position(|b| *b == b':')?;
    let digits = &bytes[..colon];
    // Digits only, as the Lua decoder requires ("+3" would parse here).
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let len: usize = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let start = colon + 1;
    let end = start.checked_add(len)?;
    if bytes.get(end) != Some(&b',') {
        return None;
    }
    Some((&bytes[start..end], &bytes[end + 1..]))
}

/// A change message of the map's channel: op, epoch, rev, then the
/// operation's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) epoch: String,
    pub(crate) rev: u64,
    pub(crate) op: Op,
}

/// What changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Set {
        key: String,
        value: String,
    },
    /// Several keys set in one change: (key, value) pairs.
    SetMany {
        entries: Vec<(String, String)>,
    },
    Delete {
        key: String,
    },
    /// The encoded items appended to the list at `key`.
    Append {
        key: String,
        suffix: String,
    },
    /// Items removed from the list at `key` (every occurrence).
    Remove {
        key: String,
        items: Vec<String>,
    },
    Reset,
    Destroy,
}

impl Change {
    /// Parses a message; `None` when it is malformed.
    pub(crate) fn parse(bytes: &[u8]) -> Option<Self> {
        let fields: Vec<String> = netstrings(bytes)?
            .into_iter()
            .map(|field| String::from_utf8(field.to_vec()).ok())
            .collect::<Option<_>>()?;
        let mut fields = fields.into_iter();
        let op = fields.next()?;
        let epoch = fields.next()?;
        let rev = fields.next()?.parse().ok()?;
        let args: Vec<String> = fields.collect();
        let op = match (op.as_str(), args.as_slice()) {
            ("set", [key, value]) => Op::Set { key: key.clone(), value: value.clone() },
            ("mset", pairs) if !pairs.is_empty() && pairs.len() % 2 == 0 => Op::SetMany {
                entries: pairs.chunks(2).map(|pair| (pair[0].clone(), pair[1].clone())).collect(),
            },
            ("del", [key]) => Op::Delete { key: key.clone() },
            ("append", [key, suffix]) => Op::Append { key: key.clone(), suffix: suffix.clone() },
            ("remove", [key, items]) => Op::Remove { key: key.clone(), items: decode_list(items)? },
            ("reset", []) => Op::Reset,
            ("destroy", []) => Op::Destroy,
            _ => return None,
        };
        Some(Self { epoch, rev, op })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netstring_len_is_what_push_netstring_appends() {
        for len in [0, 1, 9, 10, 99, 100, 65_536] {
            let mut out = Vec::new();
            push_netstring(&mut out, &vec![b'x'; len]);
            assert_eq!(netstring_len(len), out.len(), "{len}");
        }
    }

    #[test]
    fn lists_round_trip_any_text() {
        for items in [vec![], vec![""], vec!["a", "b,c", "1:2,", "ünï", ""]] {
            let encoded = encode_list(&items);
            assert_eq!(decode_list(&encoded).unwrap(), items);
        }
        assert_eq!(encode_list(&["ab", ""]), "2:ab,0:,");
        assert_eq!(decode_list("3:ab,"), None);
        assert_eq!(decode_list("x"), None);
        assert_eq!(decode_list("-12:v0,"), None);
        assert_eq!(decode_list("+1:a,"), None);
    }

    #[test]
    fn change_messages_parse_and_malformed_ones_are_refused() {
        let set = Change::parse(b"3:set,2:e1,2:17,1:k,3:v,w,").unwrap();
        assert_eq!(
            set,
            Change { epoch: "e1".into(), rev: 17, op: Op::Set { key: "k".into(), value: "v,w".into() } }
        );
        let many = Change::parse(b"4:mset,1:e,1:3,1:a,1:1,1:b,0:,").unwrap();
        assert_eq!(
            many.op,
            Op::SetMany { entries: vec![("a".into(), "1".into()), ("b".into(), String::new())] }
        );
        let remove = Change::parse(b"6:remove,1:e,1:2,1:k,8:1:a,1:b,,").unwrap();
        assert_eq!(remove.op, Op::Remove { key: "k".into(), items: vec!["a".into(), "b".into()] });
        for bad in [
            &b""[..],
            b"3:set,",
            b"3:set,1:e,1:x,1:k,1:v,",
            b"5:reset,1:e,1:1,1:k,",
            b"4:nope,1:e,1:1,",
            b"4:mset,1:e,1:1,",
            b"4:mset,1:e,1:1,1:k,",
        ] {
            assert_eq!(Change::parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }
}
