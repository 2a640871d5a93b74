//! `inplace-controller release …`: the commands that print a NodeRelease built from what a
//! publisher put out (a sysext-bakery `SHA256SUMS`, a registry's manifest).

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use inplace_proto::{ArchitectureBuild, NodeRelease};

use crate::release::extension::{self, Image};
use crate::release::fetch::{FetchSettings, MAX_SUMS_BYTES, fetch_text};
use crate::release::import::{self, ImportError, ReleaseOptions};
use crate::release::oci::{self, Credentials, OciSettings, Resolved};

/// The `release` subcommands.
#[derive(Subcommand)]
pub enum ReleaseCommand {
    /// Print a NodeRelease for one image listed in a sysext-bakery style SHA256SUMS file
    /// (`<sha256>  <name>-<version>-<arch>.raw` lines); the image's URL is the SHA256SUMS
    /// file's directory plus its file name.
    FromSha256sums(FromSha256sums),
    /// Print a NodeRelease for an extension image kept in an OCI registry
    /// (`REGISTRY/REPOSITORY:TAG` or `@sha256:DIGEST`): the release pins the manifest's
    /// digest and the file's layer; from an index, one build per linux architecture.
    FromOci(FromOci),
}

/// `release from-oci`'s arguments.
#[derive(clap::Args)]
pub struct FromOci {
    /// The image: `[oci://]REGISTRY/REPOSITORY:TAG`, `…@sha256:DIGEST` or both.
    reference: String,
    /// The extension name (`kubernetes`): the artifact name and `/etc/extensions/<name>.raw`.
    #[arg(long)]
    name: String,
    /// The release's version (`v1.31.2`; for `--name kubernetes` also its Kubernetes version).
    #[arg(long)]
    version: String,
    /// From an index, take only this architecture's manifest (`amd64`, `arm64`; `x86-64`
    /// and `aarch64` work too); default: every linux architecture a release names.
    #[arg(long)]
    arch: Option<String>,
    /// The layer that is the file, by its `org.opencontainers.image.title` (needed when a
    /// manifest has more than one layer; for an index, in each platform's manifest).
    #[arg(long)]
    file: Option<String>,
    /// Reach the registry over http (one inside the cluster's own network), not https; a
    /// registry on localhost or 127.0.0.0/8 is reached over http anyway.
    #[arg(long)]
    plain_http: bool,
    /// The Docker `config.json` holding the credential for the registry (as `docker login`
    /// and `crane auth login` write it). Default: `$DOCKER_CONFIG/config.json`, else
    /// `~/.docker/config.json`, when it exists; without one the registry is read anonymously.
    #[arg(long, value_name = "PATH")]
    registry_config: Option<PathBuf>,
    /// A file holding a bearer token for the registry, sent as is (instead of a login).
    #[arg(long, value_name = "PATH")]
    registry_token_file: Option<PathBuf>,
    #[command(flatten)]
    print: Print,
    /// Give each request to the registry up after this long (`30s`, `2m`).
    #[arg(long, default_value = "30s")]
    timeout: inplace_proto::Duration,
}

/// `release from-sha256sums`' arguments.
#[derive(clap::Args)]
pub struct FromSha256sums {
    /// The SHA256SUMS file's URL (https, or http for a local mirror).
    url: String,
    /// The extension name (`kubernetes`): the artifact name and `/etc/extensions/<name>.raw`.
    #[arg(long)]
    name: String,
    /// The version in the image's file name (`v1.31.2`; the leading `v` may differ).
    #[arg(long)]
    version: String,
    /// The architecture in the image's file name (`x86-64`, `arm64`; `amd64` works too).
    #[arg(long, default_value = "x86-64")]
    arch: String,
    /// Set the artifact's `signatureUrl` to its URL plus this suffix (`.minisig`: the
    /// minisign signature published next to the image).
    #[arg(long)]
    signature_suffix: Option<String>,
    #[command(flatten)]
    print: Print,
    /// Give the download up after this long (`30s`, `2m`).
    #[arg(long, default_value = "30s")]
    timeout: inplace_proto::Duration,
}

/// What both commands name and print the release by.
#[derive(clap::Args)]
pub struct Print {
    /// The release's `metadata.name` (default: `<name>-<version>` in lowercase).
    #[arg(long)]
    release_name: Option<String>,
    /// How to print the release.
    #[arg(long, value_enum, default_value_t = OutputFormat::Yaml)]
    output: OutputFormat,
    /// Write the release to this file instead of stdout (only once it is complete and valid).
    #[arg(short = 'o', long = "out")]
    out: Option<PathBuf>,
}

/// How a release is printed.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum OutputFormat {
    /// YAML, with a comment naming the command.
    Yaml,
    /// Pretty JSON.
    Json,
}

impl ReleaseCommand {
    /// Runs the command: the release on stdout (or in `--out`), or an error whose text
    /// starts with its stable kind in brackets.
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            ReleaseCommand::FromSha256sums(args) => release_from_sha256sums(args),
            ReleaseCommand::FromOci(args) => release_from_oci(args),
        }
    }
}

fn release_from_sha256sums(args: FromSha256sums) -> anyhow::Result<()> {
    // The kind goes first so that scripts can match on it.
    let import_failed = |e: ImportError| anyhow::anyhow!("[{}] {e}", e.kind());
    let url = import::parse_sums_url(&args.url).map_err(import_failed)?;
    let wanted =
        import::Wanted::new(&args.name, &args.version, &args.arch).map_err(import_failed)?;
    if let Some(suffix) = &args.signature_suffix {
        import::check_signature_suffix(suffix).map_err(import_failed)?;
    }
    let settings = FetchSettings {
        timeout: args.timeout.get(),
        max_bytes: MAX_SUMS_BYTES,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let text = runtime
        .block_on(fetch_text(&url, &settings))
        .map_err(|e| anyhow::anyhow!("[{}] {e}", e.kind()))?;
    let options = ReleaseOptions {
        release_name: args.print.release_name.clone(),
        signature_suffix: args.signature_suffix,
    };
    let release =
        import::release_from_sha256sums(&url, &text, &wanted, &options).map_err(import_failed)?;
    write_release(&release, &format!("from-sha256sums {url}"), args.print)
}

fn release_from_oci(args: FromOci) -> anyhow::Result<()> {
    // The kind goes first so that scripts can match on it.
    let import_failed = |e: ImportError| anyhow::anyhow!("[{}] {e}", e.kind());
    let invalid = |flag, value: &str, message: String| {
        import_failed(ImportError::InvalidArgument {
            flag,
            value: value.to_owned(),
            message,
        })
    };
    let named = inplace_proto::oci::Named::parse(&args.reference)
        .map_err(|message| invalid("REFERENCE", &args.reference, message))?;
    import::check_extension(&args.name, &args.version).map_err(import_failed)?;
    let only = args
        .arch
        .as_deref()
        .map(|arch| {
            oci::architecture_named(arch).ok_or_else(|| {
                invalid(
                    "--arch",
                    arch,
                    "not a node architecture (amd64, arm64, riscv64, ppc64le, s390x)".into(),
                )
            })
        })
        .transpose()?;
    let settings = OciSettings {
        timeout: args.timeout.get(),
        plain_http: args.plain_http,
        credentials: Credentials {
            token_file: args.registry_token_file.clone(),
            docker_config: args.registry_config.clone().or_else(default_docker_config),
        },
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let resolved = runtime
        .block_on(oci::resolve(&named, only, args.file.as_deref(), &settings))
        .map_err(|e| anyhow::anyhow!("[{}] {e}", e.kind()))?;
    for skipped in &resolved.skipped {
        eprintln!("note: {named}: passed over {skipped}");
    }
    let options = ReleaseOptions {
        release_name: args.print.release_name.clone(),
        signature_suffix: None,
    };
    let release = extension::release_for(image_of(resolved), &args.name, &args.version, &options)
        .map_err(import_failed)?;
    write_release(
        &release,
        &format!("from-oci {}", args.reference),
        args.print,
    )
}

/// The artifact's image: the first build in `url`, the others in `otherArchitectures`.
fn image_of(resolved: Resolved) -> Image {
    Image {
        url: resolved.build.url,
        sha256: resolved.build.sha256,
        size: Some(resolved.build.size),
        signature_url: None,
        architecture: resolved.architecture,
        other_architectures: resolved
            .others
            .into_iter()
            .map(|(architecture, build)| ArchitectureBuild {
                architecture,
                url: build.url,
                sha256: build.sha256,
                size: Some(build.size),
                signature_url: None,
            })
            .collect(),
    }
}

/// The Docker `config.json` a login wrote, where Docker, containerd and crane look for it:
/// `$DOCKER_CONFIG/config.json` when `DOCKER_CONFIG` is set, else `~/.docker/config.json`;
/// none when that file does not exist (the registry is then read anonymously).
fn default_docker_config() -> Option<PathBuf> {
    let dir = match std::env::var_os("DOCKER_CONFIG") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".docker"),
    };
    Some(dir.join("config.json")).filter(|path| path.exists())
}

/// Prints `release` (or writes it to `--out`), a YAML one with a comment naming `made_by`.
fn write_release(release: &NodeRelease, made_by: &str, print: Print) -> anyhow::Result<()> {
    let rendered = match print.output {
        OutputFormat::Yaml => extension::to_yaml(release, made_by),
        OutputFormat::Json => extension::to_json(release),
    };
    match print.out {
        Some(path) => {
            std::fs::write(&path, rendered).with_context(|| format!("writing {}", path.display()))
        }
        None => {
            print!("{rendered}");
            Ok(())
        }
    }
}
