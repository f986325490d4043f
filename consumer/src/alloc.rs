//! Allocator tuning for inference on glibc. A forward pass allocates large
//! tensors (attention scores reach ~100 MB a batch); by default glibc maps and
//! unmaps each one, and the page faults dominated CPU inference time. Keeping
//! freed memory in the heap lets the next batch reuse it. The budget bounds the
//! batch size, so what the heap keeps is bounded too.

/// Called once at start-up, before the model allocates.
#[allow(unsafe_code)]
pub fn tune() {
    if std::env::var_os("SLUICE_NO_MALLOPT").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before
    // the executor thread starts and takes plain integers.
    unsafe {
        // Serve every allocation from the heap instead of fresh mappings...
        libc::mallopt(libc::M_MMAP_MAX, 0);
        // ...and do not hand freed memory back to the kernel after each batch.
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}
