//! placeholder

pub mod capture;
pub mod cli;
pub mod device;
pub mod effect;
pub mod escpos;
pub mod expected;
pub mod fleet;
pub mod printer;
pub mod raw_printer;
pub mod registry;
pub mod terminal;
