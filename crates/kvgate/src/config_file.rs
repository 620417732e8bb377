//! `--config FILE` for subcommands whose flags are the single source of
//! truth: the file's keys are the flags' long names, and each entry becomes
//! `--key value` placed before the command line's own flags. The flags'
//! parser then validates the file exactly as it validates the command line
//! (unknown keys, bad values), and command-line flags win because a later
//! occurrence overrides an earlier one.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{bail, Context};

/// Flags equivalent to the TOML file at `path`.
pub(crate) fn flags_from_file(path: &Path) -> anyhow::Result<Vec<OsString>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))?;
    let mut flags = Vec::new();
    for (key, value) in table {
        if key == "config" {
            bail!("{}: a config file cannot name another config file", path.display());
        }
        let flag = format!("--{}", key.replace('_', "-"));
        match value {
            toml::Value::Boolean(true) => flags.push(flag.into()),
            toml::Value::Boolean(false) => {}
            toml::Value::String(s) => flags.extend([flag.into(), s.into()]),
            toml::Value::Integer(i) => flags.extend([flag.into(), i.to_string().into()]),
            toml::Value::Float(f) => flags.extend([flag.into(), f.to_string().into()]),
            other => bail!(
                "{}: `{key}` must be a string, number or boolean, not {}",
                path.display(),
                other.type_str()
            ),
        }
    }
    Ok(flags)
}

/// `argv` with the config file's flags inserted right after the
/// subcommand's name (`argv[..=subcommand_at]`).
pub(crate) fn expand(
    argv: &[OsString],
    subcommand_at: usize,
    file_flags: Vec<OsString>,
) -> Vec<OsString> {
    let split = (subcommand_at + 1).min(argv.len());
    let mut out = argv[..split].to_vec();
    out.extend(file_flags);
    out.extend_from_slice(&argv[split..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_becomes_flags_before_the_command_line() {
        let dir = std::env::temp_dir().join(format!("kvgate-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("sim.toml");
        std::fs::write(
            &file,
            "num_gpu_blocks = 4096\nhash_bytes = true\nself_describing_cpu_events = false\ntiming = \"llmd_qwen3_32b\"\nspeedup = 2.5\n",
        )
        .unwrap();
        let flags = flags_from_file(&file).unwrap();
        let flags: Vec<String> = flags.iter().map(|f| f.to_string_lossy().into_owned()).collect();
        // Keys come out sorted; the order of distinct flags does not matter.
        assert_eq!(
            flags,
            [
                "--hash-bytes",
                "--num-gpu-blocks",
                "4096",
                "--speedup",
                "2.5",
                "--timing",
                "llmd_qwen3_32b"
            ]
        );
        let argv: Vec<OsString> =
            ["kvgate", "sim", "--port", "1"].iter().map(OsString::from).collect();
        let out = expand(&argv, 1, vec!["--port".into(), "9".into()]);
        assert_eq!(out, ["kvgate", "sim", "--port", "9", "--port", "1"].map(OsString::from));
        std::fs::write(&file, "nested = { a = 1 }\n").unwrap();
        assert!(flags_from_file(&file).is_err());
        std::fs::write(&file, "not toml = = \n").unwrap();
        assert!(flags_from_file(&file).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
