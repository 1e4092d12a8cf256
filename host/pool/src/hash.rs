//! Routing: CRC-64 of the key, then Jump Consistent Hash over the slots,
//! exactly as Go Pulse routes (so a key lands in the same bucket).

/// CRC-64/XZ (Go's `hash/crc64` with the ECMA table): reflected polynomial
/// 0xC96C5795D7870F42, initial value and final XOR all ones.
pub fn crc64(bytes: &[u8]) -> u64 {
    const POLY: u64 = 0xC96C_5795_D787_0F42;
    static TABLE: std::sync::LazyLock<[u64; 256]> = std::sync::LazyLock::new(|| {
        let mut table = [0u64; 256];
        for (i, entry) in table.iter_mut().enumerate() {
            let mut crc = i as u64;
            for _ in 0..8 {
                crc = if crc & 1 == 1 { (crc >> 1) ^ POLY } else { crc >> 1 };
            }
            *entry = crc;
        }
        table
    });
    let mut crc = !0u64;
    for byte in bytes {
        crc = TABLE[((crc ^ u64::from(*byte)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// Jump Consistent Hash (Lamping and Veach): the bucket in `0..buckets` of
/// `hash`. Moving from n to n + 1 buckets moves about 1/(n + 1) of the keys,
/// all to the new bucket. `buckets` must be at least 1.
pub fn jump(mut hash: u64, buckets: u32) -> u32 {
    let (mut b, mut j): (i64, i64) = (-1, 0);
    while j < i64::from(buckets) {
        b = j;
        hash = hash.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        // The reference arithmetic, in doubles, as written.
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((hash >> 33) + 1) as f64)) as i64;
    }
    u32::try_from(b).unwrap_or(0)
}

/// The number of virtual slots of a pool this version creates. Keys route
/// to slots, slots to workers (the pool's slot table): membership changes
/// move whole slots, so a key's slot never changes. 4,096 slots keep every
/// worker's share within one slot (0.025 % of the keys) of even for any
/// pool of up to 4,096 workers, at about 330 KB per node for the table's
/// replica and a few bytes per moved slot for each change.
///
/// A pool keeps the count it was created with: it is part of the pool's
/// epoch (`<random hex>:<slots>`), and nodes route by that.
pub const VIRTUAL_SLOTS: u32 = 4_096;

/// The slot count recorded in pool epoch `epoch`; `None` for an epoch
/// without one (a pool created by a version with one slot per worker).
/// An epoch is `<hex>:<slots>`, or `<hex>:<slots>:g<groups>` for a pool
/// of several slot groups (which versions without groups cannot parse, so
/// they refuse such a pool instead of routing it as one group).
pub fn slot_count(epoch: &str) -> Option<u32> {
    let (slots, _) = epoch_layout(epoch)?;
    Some(slots)
}

/// The slot groups recorded in pool epoch `epoch` (1 when it names none);
/// `None` when it cannot be read.
pub fn slot_groups(epoch: &str) -> Option<u32> {
    let (_, groups) = epoch_layout(epoch)?;
    Some(groups)
}

/// The slot count and slot groups recorded in pool epoch `epoch`; `None`
/// when it cannot be read.
pub(crate) fn epoch_layout(epoch: &str) -> Option<(u32, u32)> {
    let mut parts = epoch.split(':');
    let _random = parts.next()?;
    let slots: u32 = parts.next()?.parse().ok().filter(|slots| (1..=1 << 16).contains(slots))?;
    let groups = match parts.next() {
        None => 1,
        Some(groups) => groups.strip_prefix('g')?.parse().ok().filter(|&g| valid_groups(g, slots))?,
    };
    parts.next().is_none().then_some((slots, groups))
}

/// Whether `groups` slot groups fit `slots` slots: a power of two dividing
/// them.
pub fn valid_groups(groups: u32, slots: u32) -> bool {
    groups.is_power_of_two() && slots.is_multiple_of(groups)
}

/// The slot group of `key` in a pool of `slots` slots and `groups` groups:
/// its slot modulo `groups`, so every group holds the same share of the
/// slots and a key's group never changes.
pub fn group_of(key: &str, slots: u32, groups: u32) -> u32 {
    if groups <= 1 { 0 } else { slot_of(key, slots) % groups }
}

/// The slot of `key` among `slots` slots.
pub fn slot_of(key: &str, slots: u32) -> u32 {
    jump(crc64(key.as_bytes()), slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_count_is_read_from_the_epoch() {
        assert_eq!(slot_count("3f2a9c0d11e4b7a2:4096"), Some(4096));
        assert_eq!(slot_count("3f2a9c0d11e4b7a2"), None, "an epoch of one slot per worker");
        assert_eq!(slot_count("3f2a:0"), None);
        assert_eq!(slot_count("3f2a:65537"), None);
        assert_eq!(slot_count("3f2a:x"), None);
    }

    #[test]
    fn slot_groups_are_read_from_the_epoch() {
        assert_eq!(slot_groups("3f2a:4096"), Some(1));
        assert_eq!(slot_groups("3f2a:4096:g16"), Some(16));
        assert_eq!(slot_count("3f2a:4096:g16"), Some(4096));
        assert_eq!(slot_groups("3f2a:4096:g3"), None, "not a power of two");
        assert_eq!(slot_groups("3f2a:4096:g8192"), None, "more groups than slots");
        assert_eq!(slot_groups("3f2a:4096:16"), None);
        assert_eq!(slot_groups("3f2a:4096:g16:x"), None);
    }

    #[test]
    fn groups_share_the_keys_evenly_and_one_group_is_every_key() {
        let keys: Vec<String> = (0..16_000).map(|i| format!("job-{i}")).collect();
        assert!(keys.iter().all(|k| group_of(k, VIRTUAL_SLOTS, 1) == 0));
        let mut counts = [0u32; 16];
        for key in &keys {
            let group = group_of(key, VIRTUAL_SLOTS, 16);
            assert_eq!(group, slot_of(key, VIRTUAL_SLOTS) % 16);
            counts[group as usize] += 1;
        }
        assert!(counts.iter().all(|&n| (850..1150).contains(&n)), "{counts:?}");
    }

    /// From `jump-hash-vectors.txt`, computed by Go Pulse's own hasher.
    const VECTORS: &[(&str, u64, [u32; 8])] = &[
        ("a", 0x3302_8477_2e65_2b05, [0, 0, 0, 0, 0, 0, 0, 0]),
        ("b", 0x74a8_fe9e_8582_d431, [0, 0, 0, 0, 0, 0, 0, 0]),
        ("c", 0xc786_b220_8625_8b5e, [0, 1, 2, 2, 2, 2, 2, 2]),
        ("job-000000", 0xa427_c81f_1852_cc2c, [0, 0, 0, 0, 0, 0, 0, 7]),
        ("job-000001", 0x1709_84a1_1bf5_9343, [0, 0, 2, 2, 2, 5, 5, 5]),
        ("job-012345", 0x8b48_4e44_fc14_c27a, [0, 0, 2, 2, 2, 2, 2, 2]),
    ];

    #[test]
    fn routes_exactly_like_go_pulse() {
        assert_eq!(crc64(b"123456789"), 0x995D_C9BB_DF19_39FA, "CRC-64/XZ check value");
        for (key, crc, buckets) in VECTORS {
            assert_eq!(crc64(key.as_bytes()), *crc, "crc64 of {key}");
            for (n, expected) in (1..=8).zip(buckets) {
                assert_eq!(slot_of(key, n), *expected, "{key} over {n} buckets");
            }
        }
    }

    #[test]
    fn a_new_bucket_takes_about_its_share_and_only_from_others() {
        let keys: Vec<String> = (0..10_000).map(|i| format!("job-{i}")).collect();
        for n in 1..12u32 {
            let moved: Vec<_> = keys.iter().filter(|k| slot_of(k, n) != slot_of(k, n + 1)).collect();
            assert!(moved.iter().all(|k| slot_of(k, n + 1) == n), "keys only move to the new bucket");
            let share = moved.len() as f64 / keys.len() as f64;
            let expected = 1.0 / f64::from(n + 1);
            assert!((share - expected).abs() < 0.03, "n={n}: moved {share:.3}, expected {expected:.3}");
        }
    }
}
