//! SipHash-1-3 with a 128-bit output — the `siphasher` crate's `sip128::SipHasher13`, bit for
//! bit — of many messages of one length at once, eight of them side by side in the lanes of a
//! vector (one copy of the loop per instruction set, chosen at run time: [`Kernel`]). A unit
//! bound hashes one short message per row (its group's order), and one at a time that hash was
//! the largest part of the bound's time; side by side, eight cost little more than one.
//!
//! Which messages go through the lanes, and which through the crate one at a time (fewer than
//! eight left over), depends only on how many there are and their common length.

use siphasher::sip128::SipHasher13;

use crate::mechanism::cpu::Kernel;

/// Messages hashed side by side.
const LANES: usize = 8;

/// The four words of eight SipHash states, one state per lane.
type State = [[u64; LANES]; 4];

/// Appends to `out` the 128-bit SipHash-1-3 under `key` of each of the `messages.len() / width`
/// messages of `width` bytes stored one after another in `messages` (the value
/// `u128::from(SipHasher13::new_with_keys(key.0, key.1).hash(message))`).
pub(crate) fn hash_each(key: (u64, u64), messages: &[u8], width: usize, out: &mut Vec<u128>) {
    assert!(width > 0 && messages.len().is_multiple_of(width), "messages of {width} bytes");
    let count = messages.len() / width;
    let whole = count - count % LANES;
    out.reserve(count);
    let (blocks, rest) = messages.split_at(whole * width);
    match Kernel::detect() {
        Kernel::Portable => lanes(key, blocks, width, out),
        // SAFETY: `Kernel::detect` chose these only where the CPU has the instructions.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { lanes_avx2(key, blocks, width, out) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { lanes_avx512(key, blocks, width, out) },
    }
    let one = SipHasher13::new_with_keys(key.0, key.1);
    out.extend(rest.chunks_exact(width).map(|m| u128::from(one.hash(m))));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn lanes_avx2(key: (u64, u64), blocks: &[u8], width: usize, out: &mut Vec<u128>) {
    lanes(key, blocks, width, out)
}

/// [`lanes`] with one 512-bit register per state word: the compiler, left to itself, mixed the
/// state's words within registers and spent more instructions moving lanes than hashing.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2")]
fn lanes_avx512(key: (u64, u64), blocks: &[u8], width: usize, out: &mut Vec<u128>) {
    use std::arch::x86_64::*;
    macro_rules! rounds {
        ($n:expr, $v0:ident, $v1:ident, $v2:ident, $v3:ident) => {
            for _ in 0..$n {
                $v0 = _mm512_add_epi64($v0, $v1);
                $v1 = _mm512_xor_si512(_mm512_rol_epi64::<13>($v1), $v0);
                $v0 = _mm512_rol_epi64::<32>($v0);
                $v2 = _mm512_add_epi64($v2, $v3);
                $v3 = _mm512_xor_si512(_mm512_rol_epi64::<16>($v3), $v2);
                $v0 = _mm512_add_epi64($v0, $v3);
                $v3 = _mm512_xor_si512(_mm512_rol_epi64::<21>($v3), $v0);
                $v2 = _mm512_add_epi64($v2, $v1);
                $v1 = _mm512_xor_si512(_mm512_rol_epi64::<17>($v1), $v2);
                $v2 = _mm512_rol_epi64::<32>($v2);
            }
        };
    }
    let (words, left) = (width / 8, width % 8);
    let length = (width as u64 & 0xff) << 56;
    // Each lane's message starts `width` bytes after the previous lane's.
    let starts: [i64; LANES] = std::array::from_fn(|l| (l * width) as i64);
    // SAFETY (each load and store below): an array of eight `u64`s is the vector's 64 bytes.
    let starts = unsafe { _mm512_loadu_epi64(starts.as_ptr()) };
    let splat = |x: u64| _mm512_set1_epi64(x as i64);
    let (mut h1, mut h2) = ([0u64; LANES], [0u64; LANES]);
    for block in blocks.chunks_exact(LANES * width) {
        let base = block.as_ptr();
        // Eight bytes of each lane's message from `at` bytes into it (`at + 8 <= width`).
        // SAFETY: lane l reads bytes l·width + at … + 8, inside its message, inside `block`.
        let word = |at: usize| unsafe { _mm512_i64gather_epi64::<1>(starts, base.add(at).cast()) };
        let mut v0 = splat(key.0 ^ 0x736f_6d65_7073_6575);
        let mut v1 = splat(key.1 ^ 0x646f_7261_6e64_6f83);
        let mut v2 = splat(key.0 ^ 0x6c79_6765_6e65_7261);
        let mut v3 = splat(key.1 ^ 0x7465_6462_7974_6573);
        for w in 0..words {
            let m = word(8 * w);
            v3 = _mm512_xor_si512(v3, m);
            rounds!(1, v0, v1, v2, v3);
            v0 = _mm512_xor_si512(v0, m);
        }
        // The last word: the length in its top byte, the message's last `left` bytes below.
        let m = match (left, words) {
            (0, _) => splat(length),
            // The message's last eight bytes, shifted so that its last `left` come first.
            (_, 1..) => _mm512_or_si512(_mm512_srlv_epi64(word(width - 8), splat(64 - 8 * left as u64)), splat(length)),
            _ => {
                let tail: [u64; LANES] = std::array::from_fn(|l| {
                    block[l * width..(l + 1) * width]
                        .iter()
                        .enumerate()
                        .fold(length, |t, (i, &b)| t | u64::from(b) << (8 * i))
                });
                unsafe { _mm512_loadu_epi64(tail.as_ptr().cast()) }
            }
        };
        v3 = _mm512_xor_si512(v3, m);
        rounds!(1, v0, v1, v2, v3);
        v0 = _mm512_xor_si512(v0, m);
        v2 = _mm512_xor_si512(v2, splat(0xee));
        rounds!(3, v0, v1, v2, v3);
        let fold = |a, b, c, d| _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
        unsafe { _mm512_storeu_epi64(h1.as_mut_ptr().cast(), fold(v0, v1, v2, v3)) };
        v1 = _mm512_xor_si512(v1, splat(0xdd));
        rounds!(3, v0, v1, v2, v3);
        unsafe { _mm512_storeu_epi64(h2.as_mut_ptr().cast(), fold(v0, v1, v2, v3)) };
        out.extend((0..LANES).map(|l| u128::from(h1[l]) | u128::from(h2[l]) << 64));
    }
}

/// Hashes `blocks` (a whole number of [`LANES`] messages of `width` bytes) eight at a time.
#[inline(always)]
fn lanes(key: (u64, u64), blocks: &[u8], width: usize, out: &mut Vec<u128>) {
    let words = width / 8;
    // The last word: the message's length in its top byte, its last `left` bytes below.
    let length = (width as u64 & 0xff) << 56;
    for block in blocks.chunks_exact(LANES * width) {
        let mut v: State = [
            [key.0 ^ 0x736f_6d65_7073_6575; LANES],
            [key.1 ^ 0x646f_7261_6e64_6f83; LANES],
            [key.0 ^ 0x6c79_6765_6e65_7261; LANES],
            [key.1 ^ 0x7465_6462_7974_6573; LANES],
        ];
        let message = |l: usize| &block[l * width..(l + 1) * width];
        for w in 0..words {
            let m: [u64; LANES] = std::array::from_fn(|l| {
                u64::from_le_bytes(message(l)[8 * w..8 * w + 8].try_into().expect("eight bytes"))
            });
            absorb(&mut v, &m);
        }
        let m: [u64; LANES] = std::array::from_fn(|l| {
            let tail = &message(l)[8 * words..];
            tail.iter().enumerate().fold(length, |t, (i, &b)| t | u64::from(b) << (8 * i))
        });
        absorb(&mut v, &m);
        xor_lanes(&mut v[2], 0xee);
        rounds::<3>(&mut v);
        let h1 = folded(&v);
        xor_lanes(&mut v[1], 0xdd);
        rounds::<3>(&mut v);
        let h2 = folded(&v);
        out.extend((0..LANES).map(|l| u128::from(h1[l]) | u128::from(h2[l]) << 64));
    }
}

/// One message word per lane: `v3 ^= m`, one compression round, `v0 ^= m`.
#[inline(always)]
fn absorb(v: &mut State, m: &[u64; LANES]) {
    for l in 0..LANES {
        v[3][l] ^= m[l];
    }
    rounds::<1>(v);
    for l in 0..LANES {
        v[0][l] ^= m[l];
    }
}

#[inline(always)]
fn xor_lanes(word: &mut [u64; LANES], x: u64) {
    for w in word.iter_mut() {
        *w ^= x;
    }
}

/// `v0 ^ v1 ^ v2 ^ v3` per lane.
#[inline(always)]
fn folded(v: &State) -> [u64; LANES] {
    std::array::from_fn(|l| v[0][l] ^ v[1][l] ^ v[2][l] ^ v[3][l])
}

/// `N` SipRounds in every lane.
#[inline(always)]
fn rounds<const N: usize>(v: &mut State) {
    let [v0, v1, v2, v3] = v;
    for _ in 0..N {
        for l in 0..LANES {
            v0[l] = v0[l].wrapping_add(v1[l]);
            v1[l] = v1[l].rotate_left(13) ^ v0[l];
            v0[l] = v0[l].rotate_left(32);
            v2[l] = v2[l].wrapping_add(v3[l]);
            v3[l] = v3[l].rotate_left(16) ^ v2[l];
            v0[l] = v0[l].wrapping_add(v3[l]);
            v3[l] = v3[l].rotate_left(21) ^ v0[l];
            v2[l] = v2[l].wrapping_add(v1[l]);
            v1[l] = v1[l].rotate_left(17) ^ v2[l];
            v2[l] = v2[l].rotate_left(32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::ChaCha20Rng;
    use rand::{RngExt, SeedableRng};

    fn by_the_crate(key: (u64, u64), messages: &[u8], width: usize) -> Vec<u128> {
        let h = SipHasher13::new_with_keys(key.0, key.1);
        messages.chunks_exact(width).map(|m| u128::from(h.hash(m))).collect()
    }

    /// Every kernel this CPU runs, at every length from 1 to 40 bytes (every tail, several
    /// words) and every count from 0 to 19 messages (whole blocks and the rest), hashes as the
    /// crate does.
    #[test]
    fn every_kernel_hashes_as_the_crate_does() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        for width in 1..=40 {
            for count in 0..20 {
                let key = (rng.random(), rng.random());
                let messages: Vec<u8> = (0..width * count).map(|_| rng.random()).collect();
                let expected = by_the_crate(key, &messages, width);
                let mut got = Vec::new();
                hash_each(key, &messages, width, &mut got);
                assert_eq!(got, expected, "width {width}, count {count}");
                for kernel in Kernel::available() {
                    let whole = count - count % LANES;
                    let mut lanes_only = Vec::new();
                    let blocks = &messages[..whole * width];
                    match kernel {
                        Kernel::Portable => lanes(key, blocks, width, &mut lanes_only),
                        #[cfg(target_arch = "x86_64")]
                        Kernel::Avx2 => unsafe { lanes_avx2(key, blocks, width, &mut lanes_only) },
                        #[cfg(target_arch = "x86_64")]
                        Kernel::Avx512 => unsafe { lanes_avx512(key, blocks, width, &mut lanes_only) },
                    }
                    assert_eq!(lanes_only, expected[..whole], "{kernel:?}, width {width}, count {count}");
                }
            }
        }
    }

    /// Control: a message with one bit changed, or the key's halves swapped, hashes differently
    /// (the comparison above would see a lane that ignored part of its message or key).
    #[test]
    fn one_bit_of_a_message_or_the_key_changes_the_hash() {
        let key = (0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210);
        let messages: Vec<u8> = (0..26 * 8).map(|i| i as u8).collect();
        let mut base = Vec::new();
        hash_each(key, &messages, 26, &mut base);
        for bit in [0, 7, 8 * 13, 8 * 25 + 7, 8 * (26 * 7 + 25)] {
            let mut flipped = messages.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let mut other = Vec::new();
            hash_each(key, &flipped, 26, &mut other);
            let lane = bit / 8 / 26;
            assert_ne!(other[lane], base[lane], "bit {bit}");
            assert_eq!(other.iter().filter(|&&h| !base.contains(&h)).count(), 1, "only its lane changes");
        }
        let mut swapped = Vec::new();
        hash_each((key.1, key.0), &messages, 26, &mut swapped);
        assert!(swapped.iter().zip(&base).all(|(a, b)| a != b));
    }
}
