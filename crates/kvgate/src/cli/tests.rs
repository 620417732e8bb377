//! Every `kvgate` command the docs quote parses with this CLI: the fenced
//! `bash`/`sh` blocks of README.md, ARCHITECTURE.md and `docs/*.md`, read as
//! `tests/support/shell.rs` says (continuations joined, quotes and variables
//! expanded, pipes and `&&` split). A doc that quotes a flag kvgate no longer
//! has, a subcommand that moved, or a value the flag refuses fails here with
//! the doc's file and line and clap's own message.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use clap::Parser;

#[path = "../../tests/support/shell.rs"]
mod shell;

use super::Cli;

/// clap's verdict on one command's arguments: `None` when they parse.
fn parse_error(args: &[String]) -> Option<String> {
    match Cli::try_parse_from(std::iter::once("kvgate".to_owned()).chain(args.iter().cloned())) {
        Ok(_) => None,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            None
        }
        Err(e) => Some(e.to_string()),
    }
}

#[test]
fn every_kvgate_command_in_the_docs_parses() {
    let commands: Vec<_> = shell::doc_commands()
        .into_iter()
        .filter_map(|c| shell::kvgate_args(&c).map(|args| (c.at, args)))
        .collect();
    // The docs quote kvgate in every document that runs it; far fewer means
    // the reader stopped finding them, not that the docs stopped quoting them.
    assert!(commands.len() >= 20, "only {} kvgate commands found in the docs", commands.len());
    let problems: Vec<String> = commands
        .iter()
        .filter_map(|(at, args)| {
            parse_error(args).map(|e| format!("{at}: kvgate {}\n{e}", args.join(" ")))
        })
        .collect();
    assert!(
        problems.is_empty(),
        "commands in the docs that kvgate refuses:\n\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_docs_are_read_as_a_shell_reads_them() {
    let doc = r#"
text
```bash
# a comment
K=./target/release/kvgate
FLAGS="--policies kv_aware --json out.json"
$K replay --workload synthetic:chat $FLAGS   # trailing comment
echo '{"prompt":"Hi"}' | cargo run -q -p kvgate -- tokenize
RUST_LOG=debug kvgate serve --replica 'http://h:8000,events=tcp://h:5557' \
    --api-key "$CLIENT_KEY" > log.txt 2>&1 &
specs=$(bash scripts/real-vllm.sh fleet 2)
cargo run --release -p kvgate -- serve $(printf -- '--replica %s ' $specs) && curl -s x
cargo run --release -p kvgate --example load -- find-max
for i in 1 2; do kvgate sim --port 8100; done
```
```toml
kvgate = "not a command"
```
"#;
    let commands = shell::commands_in("doc.md", doc);
    let kv: Vec<(String, Vec<String>)> =
        commands.iter().filter_map(|c| shell::kvgate_args(c).map(|a| (c.at.clone(), a))).collect();
    let words = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(
        kv,
        vec![
            (
                "doc.md:7".to_owned(),
                words("replay --workload synthetic:chat --policies kv_aware --json out.json")
            ),
            ("doc.md:8".to_owned(), words("tokenize")),
            (
                "doc.md:9".to_owned(),
                words(
                    "serve --replica http://h:8000,events=tcp://h:5557 --api-key placeholder-value"
                )
            ),
            ("doc.md:12".to_owned(), words("serve")),
            ("doc.md:14".to_owned(), words("sim --port 8100")),
        ]
    );
    assert!(commands.iter().any(|c| c.words == words("curl -s x")));
    assert!(parse_error(&words("serve --no-such-flag")).is_some());
    assert!(parse_error(&words("serve --listen not-an-address")).is_some());
    assert!(parse_error(&words("serve --listen 127.0.0.1:8000 --help")).is_none());
}
