//! g4ft: umbrella crate re-exporting the workspace crates for the examples, benches and tests.
pub use g4ft_data as data;
pub use g4ft_ddp as ddp;
pub use g4ft_gemma4 as gemma4;
pub use g4ft_generate as generate;
pub use g4ft_hash as hash;
pub use g4ft_lora as lora;
pub use g4ft_ops as ops;
pub use g4ft_trainer as trainer;
