//! `kvroute-sim tokenizer --out DIR [--vocab N]`: writes the test tokenizer of
//! `kvroute::tokenize::testing` (a real HF `tokenizer.json` where word `tN` is token id
//! N, and a `tokenizer_config.json` with a ChatML-like chat template), for tests, the
//! README demo and workload generators: `kvroute serve --tokenizer MODEL=DIR`.

use clap::Args;
use kvroute::tokenize::testing;
use std::path::PathBuf;

#[derive(Args)]
pub struct TokenizerArgs {
    /// Directory to write tokenizer.json and tokenizer_config.json into (created).
    #[arg(long)]
    pub out: PathBuf,
    /// Words t0 .. t{N-1} are token ids 0 .. N-1; special tokens and role words follow.
    #[arg(long, default_value_t = testing::DEFAULT_VOCAB)]
    pub vocab: u32,
}

pub fn run(a: TokenizerArgs) -> Result<(), String> {
    testing::write_dir(&a.out, a.vocab)?;
    println!(
        "wrote {} (tokenizer.json, tokenizer_config.json): t0..t{} are ids 0..{}, then {}",
        a.out.display(),
        a.vocab - 1,
        a.vocab - 1,
        testing::EXTRA_TOKENS.join(" ")
    );
    Ok(())
}
