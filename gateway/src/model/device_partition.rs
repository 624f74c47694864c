//! Which device-jobs partition a device's jobs are on: the partition Kafka's default
//! partitioner gives the device id as a record key (the Java client's `murmur2`, librdkafka's
//! `partitioner=murmur2_random`), so the deliver stage knows which partition connection
//! sends to a device without asking Kafka.

/// Kafka's 32-bit murmur2 of `data` (`org.apache.kafka.common.utils.Utils.murmur2`: seed
/// `0x9747b28c`, librdkafka's `rd_murmur2`), as the signed value Java returns.
pub fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        if tail.len() >= 3 {
            h ^= u32::from(tail[2]) << 16;
        }
        if tail.len() >= 2 {
            h ^= u32::from(tail[1]) << 8;
        }
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition, of `partitions` (> 0), that a record keyed by `device` goes to:
/// `(murmur2(key) & 0x7fffffff) % partitions`.
pub fn partition_of(device: &str, partitions: i32) -> i32 {
    (murmur2(device.as_bytes()) & 0x7fff_ffff) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_gives_kafkas_own_test_values() {
        // Kafka's UtilsTest.testMurmur2.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
            (b"abc", 479_470_107),
        ];
        for (data, want) in cases {
            assert_eq!(murmur2(data), want, "{}", String::from_utf8_lossy(data));
        }
    }

    #[test]
    fn a_device_lands_where_librdkafkas_partitioner_puts_it() {
        let mut seed = 7u64;
        for n in 0..2_000u32 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let len = (seed >> 59) as usize;
            let id: String = (0..len).map(|i| char::from(b'a' + ((seed >> (i * 2)) % 26) as u8)).collect();
            let id = format!("{id}-{n}");
            for partitions in [1, 6, 48] {
                // SAFETY: the murmur2 partitioner reads only the key (`rkt` is used for
                // a null key alone, and the key is never null here).
                let theirs = unsafe {
                    rdkafka::bindings::rd_kafka_msg_partitioner_murmur2_random(
                        std::ptr::null(),
                        id.as_ptr().cast(),
                        id.len(),
                        partitions,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(partition_of(&id, partitions), theirs, "{id} over {partitions}");
            }
        }
    }
}
