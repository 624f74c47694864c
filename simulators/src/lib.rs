//! placeholder

pub mod escpos;
pub mod expected;
pub mod capture;
pub mod device;
pub mod effect;
pub mod fleet;
pub mod printer;
pub mod raw_printer;
pub mod registry;
pub mod terminal;
pub mod cli;
