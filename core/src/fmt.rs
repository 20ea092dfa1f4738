//! Private logging shim (embassy style): forwards to `defmt` when the `defmt` feature is on, else compiles
//! to nothing. The rest of the crate logs only through these macros.
#![allow(unused_macros)]

macro_rules! trace {
    ($($x:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::trace!($($x)*);
    }};
}

macro_rules! log_warn {
    ($($x:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::warn!($($x)*);
    }};
}

pub(crate) use {log_warn, trace};
