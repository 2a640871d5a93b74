//! The agent updating itself through its plan (issue 23). The images an agent switch installs,
//! checked on the host: the second agent build and the signed images the switch's node tests
//! order (support/agent_images.rs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)] // The other suites use the rest of the packaging helpers.
mod support;

use support::agent_images::{Behaviour, ReleaseKey, agent_image};

/// The images the switch tests order, checked on the host: the new agent reports the
/// version its image is named and signed for, the signature verifies with the trusted
/// comment the agent requires, and the refused-identity image's vendor layer names its own
/// kubeconfig. Costs the second agent build (see support/agent_images.rs), no node.
#[test]
fn the_agent_images_carry_their_version_and_a_signature_naming_it() {
    inplace_tests::prereq::require_squashfs_tools().expect("prerequisites");
    let version = format!("{}-next.2", env!("CARGO_PKG_VERSION"));
    let out = tempfile::tempdir().unwrap();
    let key = ReleaseKey::generate();

    let binary = support::agent_images::agent_binary_at(&version);
    let reported = std::process::Command::new(&binary)
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&reported.stdout).trim(),
        format!("inplace-agent {version}")
    );

    let image = agent_image(Behaviour::IdentityRefused, &version, out.path(), "refused");
    let file = image.file_name().unwrap().to_str().unwrap().to_owned();
    assert_eq!(file, format!("inplace-agent-{version}-x86-64.raw"));
    let signature = key.sign(&image, &version);
    let signature =
        minisign::SignatureBox::from_string(&std::fs::read_to_string(signature).unwrap()).unwrap();
    assert_eq!(
        signature.trusted_comment().unwrap(),
        format!("file:{file} version:{version}")
    );
    let public = minisign::PublicKeyBox::from_string(&key.public_file())
        .unwrap()
        .into_public_key()
        .unwrap();
    minisign::verify(
        &public,
        &signature,
        std::io::Cursor::new(std::fs::read(&image).unwrap()),
        true,
        false,
        false,
    )
    .expect("the signature verifies");
    let vendor = std::process::Command::new("unsquashfs")
        .args(["-cat"])
        .arg(&image)
        .arg("usr/lib/inplace/agent.toml")
        .output()
        .unwrap();
    let vendor = String::from_utf8_lossy(&vendor.stdout);
    assert!(
        vendor.contains("[kubernetes]\nkubeconfig = \"/usr/lib/inplace/refused.kubeconfig\""),
        "{vendor}"
    );
}
