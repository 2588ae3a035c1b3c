//! The endpoint picker's flags (`--epp-*`, env `KVROUTE_EPP_*`), to be flattened into
//! `kvroute serve`'s arguments, and how they overlay `[epp]` ([`EppArgs::apply`]).
//! Each field is named like its [`EppSettings`] field; an unset flag leaves the file's
//! or the default value in place. Argument ids carry an `epp_` prefix (clap ids are
//! shared with the other flattened groups).

use super::config::EppSettings;
use clap::Args;

#[derive(Args, Debug, Default, Clone)]
pub struct EppArgs {
    /// ext_proc gRPC address of the endpoint picker (`IP:PORT`; empty or `off`: none).
    #[arg(id = "epp_addr", long = "epp-addr", env = "KVROUTE_EPP_ADDR")]
    pub addr: Option<String>,
    #[arg(
        id = "epp_max_body_bytes",
        long = "epp-max-body-bytes",
        env = "KVROUTE_EPP_MAX_BODY_BYTES"
    )]
    pub max_body_bytes: Option<usize>,
    #[arg(
        id = "epp_max_header_count",
        long = "epp-max-header-count",
        env = "KVROUTE_EPP_MAX_HEADER_COUNT"
    )]
    pub max_header_count: Option<usize>,
    #[arg(
        id = "epp_max_header_bytes",
        long = "epp-max-header-bytes",
        env = "KVROUTE_EPP_MAX_HEADER_BYTES"
    )]
    pub max_header_bytes: Option<usize>,
    #[arg(
        id = "epp_max_streams",
        long = "epp-max-streams",
        env = "KVROUTE_EPP_MAX_STREAMS"
    )]
    pub max_streams: Option<usize>,
}

impl EppArgs {
    /// The flags that were given, over `e`.
    pub fn apply(&self, e: &mut EppSettings) {
        if let Some(a) = &self.addr {
            e.addr = a.clone();
        }
        macro_rules! overlay {
            ($($field:ident),*) => {
                $( if let Some(v) = self.$field { e.$field = v; } )*
            };
        }
        overlay!(
            max_body_bytes,
            max_header_count,
            max_header_bytes,
            max_streams
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        epp: EppArgs,
    }

    #[test]
    fn flags_overlay_only_what_was_given() {
        let cli =
            Cli::try_parse_from(["x", "--epp-addr", "0.0.0.0:9002", "--epp-max-streams", "9"])
                .unwrap();
        let mut s = EppSettings {
            max_header_count: 7,
            ..EppSettings::default()
        };
        cli.epp.apply(&mut s);
        assert_eq!(s.addr, "0.0.0.0:9002");
        assert_eq!((s.max_streams, s.max_header_count), (9, 7));
    }
}
