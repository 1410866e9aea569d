//! Pushing what a measurement reads out of the core's caches, as a server's other work (TLS,
//! HTTP, the kernel's) does between two requests.

/// A cache line on the machines measured: touching one byte of each brings all of it in, as any
/// use would.
const LINE: usize = 64;

/// Writes one byte of each cache line of `buffer`.
pub fn touch(buffer: &mut [u8]) {
    for byte in buffer.iter_mut().step_by(LINE) {
        *byte = byte.wrapping_add(1);
    }
    std::hint::black_box(buffer);
}
