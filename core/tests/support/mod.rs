//! What the scenario tests share.
// Each test binary uses a part of it.
#![allow(dead_code)]

pub mod hybrid;
pub mod run;
