//! Everything the CRD schema cannot express, checked the same way by the controller (for a
//! release) and by the agent (for a plan, before any I/O).
//!
//! Every check reports *all* problems, each with the field path it concerns. Checks about
//! where on a node something may land or come from (absolute paths, URL schemes, unit
//! names) report `PolicyDenied`: no node policy could allow them. The node's own policy
//! adds its rules on top, in the agent.
//!
//! The parts: how problems are reported (`problems.rs`), the content a release and a plan
//! share (`content.rs`), one artifact (`artifact.rs`) and its builds for other
//! architectures (`architecture.rs`), an agent update (`agent_image.rs`), names and paths
//! (`names.rs`), URLs (`urls.rs`), and each API object as a whole (`objects.rs`).

mod agent_image;
mod architecture;
mod artifact;
mod content;
mod names;
mod objects;
mod problems;
mod urls;

pub use artifact::check_sha256;
pub(crate) use content::check_content;
pub use names::{check_artifact_name, check_node_path, check_object_name, check_unit_name};
pub(crate) use problems::Collector;
pub use problems::{FieldError, Problems};
pub(crate) use urls::{check_signature_url, check_url_scheme_and_credentials, parse_url};
pub use urls::{url_basename, url_file_name};
