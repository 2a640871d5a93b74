//! Test beds for inplace: the Kubernetes API emulator, real systemd hosts booted with
//! `systemd-nspawn`, and a controllable artifact server. The end-to-end suites live in
//! `tests/tests/`.
