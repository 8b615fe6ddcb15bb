//! Which process this is, cheaply: a crew's threads belong to the process that started them, and
//! a child made by `fork` has none of them. Asking the kernel for the process id costs a system
//! call on every wave; a count of forks, bumped in each child by a handler registered once,
//! costs a load.

/// Changes in a child made by `fork`; the same everywhere else in one process.
pub(crate) fn generation() -> u32 {
    imp::generation()
}

#[cfg(unix)]
mod imp {
    use std::ffi::c_int;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Once;

    static FORKS: AtomicU32 = AtomicU32::new(0);

    extern "C" fn forked() {
        FORKS.fetch_add(1, Ordering::Relaxed);
    }

    #[allow(unsafe_code)]
    extern "C" {
        fn pthread_atfork(
            prepare: Option<unsafe extern "C" fn()>,
            parent: Option<unsafe extern "C" fn()>,
            child: Option<unsafe extern "C" fn()>,
        ) -> c_int;
    }

    pub(super) fn generation() -> u32 {
        static REGISTERED: Once = Once::new();
        REGISTERED.call_once(|| {
            // SAFETY: `forked` only bumps an atomic, which is async-signal-safe, as a handler
            // run in a freshly forked child must be. A failed registration (out of memory)
            // leaves every generation 0: a forked child's crew then miscounts its threads, as
            // before there was this check.
            #[allow(unsafe_code)]
            unsafe {
                pthread_atfork(None, None, Some(forked));
            }
        });
        FORKS.load(Ordering::Relaxed)
    }
}

#[cfg(not(unix))]
mod imp {
    /// Without `fork`, one generation.
    pub(super) fn generation() -> u32 {
        0
    }
}
