//! The module's exceptions, one per kind of the core's errors.

use kvsched_core::error::Error;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::PyErr;

create_exception!(
    kvsched,
    KvschedError,
    PyException,
    "A call kvsched refused; nothing changed."
);
create_exception!(
    kvsched,
    CapacityError,
    KvschedError,
    "A fixed capacity is exhausted."
);
create_exception!(
    kvsched,
    RequestTooLarge,
    KvschedError,
    "A request larger than the KV pool."
);
create_exception!(
    kvsched,
    UnknownRequest,
    KvschedError,
    "An id that names no live request."
);
create_exception!(
    kvsched,
    DuplicateRequest,
    KvschedError,
    "A submitted id that a live request already has."
);
create_exception!(
    kvsched,
    AdapterError,
    KvschedError,
    "The adapter cache refused."
);
create_exception!(
    kvsched,
    DeadlockError,
    KvschedError,
    "No request could be scheduled for the deadlock threshold's passes."
);
create_exception!(
    kvsched,
    StaleOutput,
    KvschedError,
    "A step completed twice, or before any pass."
);

/// The core's error as the Python exception of its kind, with the core's message.
pub(crate) fn py_err(e: Error) -> PyErr {
    py_err_with(e, e.to_string())
}

/// The core's error as the Python exception of its kind, with `msg`.
pub(crate) fn py_err_with(e: Error, msg: String) -> PyErr {
    match e {
        Error::CapacityExhausted { .. } => CapacityError::new_err(msg),
        Error::RequestTooLarge { .. } => RequestTooLarge::new_err(msg),
        Error::DuplicateId(_) => DuplicateRequest::new_err(msg),
        Error::StaleHandle => UnknownRequest::new_err(msg),
        Error::Peft(_) => AdapterError::new_err(msg),
        Error::Deadlock { .. } => DeadlockError::new_err(msg),
        Error::StaleOutput => StaleOutput::new_err(msg),
        _ => KvschedError::new_err(msg),
    }
}
