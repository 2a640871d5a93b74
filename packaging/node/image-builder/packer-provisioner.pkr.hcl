# Packer provisioner snippets for an image-builder (or any Packer) Debian/Ubuntu build.
# Put target/packages/ (from `make packages`) next to the template first.

# Option 1: the Ansible role (image-builder: add "inplace_agent" to custom_role_names
# and this directory's roles/ to ANSIBLE_ROLES_PATH; standalone Packer: this block).
provisioner "ansible" {
  playbook_file = "packaging/node/image-builder/playbook.yml"
  extra_arguments = [
    "--extra-vars", "inplace_agent_packages_dir=${path.root}/target/packages",
    "--extra-vars", "{\"inplace_agent_allowed_url_prefixes\": [\"https://extensions.example/\"]}",
  ]
}

# Option 2: plain shell (the path the nspawn test exercises: dpkg -i, no running systemd
# in the build → enabled, not started).
provisioner "file" {
  source      = "target/packages/inplace-agent_0.1.0_amd64.deb"
  destination = "/tmp/inplace-agent.deb"
}
provisioner "shell" {
  execute_command = "sudo -E sh -eux '{{ .Path }}'"
  inline = [
    "dpkg -i /tmp/inplace-agent.deb",
    "rm -f /tmp/inplace-agent.deb",
    "printf '[policy]\\nallowed_url_prefixes = [\"https://extensions.example/\"]\\n' > /etc/inplace/agent.toml",
    "systemctl is-enabled inplace-agent.service",
  ]
}
