//! Mirrors (`[[mirrors]]`): other places that serve the same bytes as a registry or as the
//! http(s) URLs under a prefix, tried in the order written, then the origin last (as
//! containerd tries a `hosts.toml`'s hosts before its `server`). Nothing here trusts a
//! mirror: the plan's sha256 decides whether its bytes are used, and every mirror URL is held
//! to the node policy when it is fetched, like any URL. Pure: which sources, in which order.

use inplace_proto::oci::Reference;
use url::Url;

use crate::url_prefix::UrlPrefix;

/// The node's mirror rules, at most one per registry and per URL prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mirrors {
    rules: Vec<MirrorRule>,
}

/// The mirrors of one registry or one URL prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorRule {
    scope: Scope,
    /// In the order they are tried.
    hosts: Vec<Url>,
}

/// What a rule mirrors.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    /// `oci://` artifacts of this registry (`host[:port]`).
    Registry(String),
    /// http(s) artifact URLs under this prefix.
    UrlPrefix(UrlPrefix),
}

/// One place to fetch an artifact from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Candidate {
    /// A mirror. For an http(s) artifact `url` is the artifact's URL under the mirror's
    /// prefix; for a registry artifact it is the mirror's distribution API endpoint of the
    /// repository (`…/v2/REPOSITORY/`). `server` is the mirror's `host[:port]`, which its
    /// credentials are looked up by.
    Mirror {
        /// What to fetch.
        url: String,
        /// `host[:port]`.
        server: String,
    },
    /// The artifact's own URL or registry.
    Origin,
}

impl Candidate {
    /// How logs and errors name it.
    pub fn label(&self) -> String {
        match self {
            Candidate::Mirror { url, .. } => format!("mirror {url}"),
            Candidate::Origin => "the origin".to_owned(),
        }
    }
}

impl MirrorRule {
    /// A rule from the config: exactly one of `registry` and `url_prefix`, and at least one
    /// host. The error names the key (relative to the rule) and what is wrong.
    pub fn new(
        registry: Option<String>,
        url_prefix: Option<String>,
        hosts: &[String],
    ) -> Result<MirrorRule, (String, String)> {
        let scope = match (registry, url_prefix) {
            (Some(registry), None) => {
                inplace_proto::oci::check_registry(&registry)
                    .map_err(|e| ("registry".into(), e))?;
                Scope::Registry(registry)
            }
            (None, Some(prefix)) => {
                Scope::UrlPrefix(prefix.parse().map_err(|e| ("url_prefix".into(), e))?)
            }
            _ => {
                return Err((
                    "registry".into(),
                    "set either registry (for oci:// artifacts) or url_prefix (for http(s) ones)"
                        .into(),
                ));
            }
        };
        if hosts.is_empty() {
            return Err(("hosts".into(), "name at least one mirror".into()));
        }
        let hosts = hosts
            .iter()
            .enumerate()
            .map(|(i, text)| host(&scope, text).map_err(|e| (format!("hosts[{i}]"), e)))
            .collect::<Result<_, _>>()?;
        Ok(MirrorRule { scope, hosts })
    }
}

/// A mirror URL: http(s), a host, no credentials, query or fragment; under a URL prefix it
/// is itself a prefix (ends in `/`), so the rest of an artifact's path is appended to it.
fn host(scope: &Scope, text: &str) -> Result<Url, String> {
    if let Scope::UrlPrefix(_) = scope {
        let _: UrlPrefix = text.parse()?;
    }
    let url = Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{text:?} is not an http(s) URL with a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{text:?}: credentials in URLs are not allowed (use [credentials])"
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{text:?}: a mirror has no query or fragment"));
    }
    Ok(url)
}

impl Mirrors {
    /// The rules, refusing a second rule for the same registry or prefix (which one wins
    /// would be a guess). The error names the later rule's index.
    pub fn new(rules: Vec<MirrorRule>) -> Result<Mirrors, (usize, String)> {
        for (i, rule) in rules.iter().enumerate() {
            if let Some(first) = rules[..i].iter().position(|r| r.scope == rule.scope) {
                return Err((i, format!("the same scope as mirrors[{first}]")));
            }
        }
        Ok(Mirrors { rules })
    }

    /// Where `artifact_url` is fetched from, in order: its rule's mirrors, then the origin.
    /// A registry artifact takes its registry's rule; an http(s) one the rule of the longest
    /// prefix that admits it. Without a rule, the origin alone.
    pub fn candidates(&self, artifact_url: &str) -> Vec<Candidate> {
        let mut candidates = match Reference::parse(artifact_url) {
            Ok(reference) => self.registry_mirrors(&reference),
            Err(_) => self.url_mirrors(artifact_url),
        };
        candidates.push(Candidate::Origin);
        candidates
    }

    fn registry_mirrors(&self, reference: &Reference) -> Vec<Candidate> {
        let Some(rule) = self
            .rules
            .iter()
            .find(|r| r.scope == Scope::Registry(reference.registry.clone()))
        else {
            return Vec::new();
        };
        rule.hosts
            .iter()
            .map(|host| Candidate::Mirror {
                // The distribution API below the mirror's path, as containerd reaches a host
                // without override_path.
                url: format!(
                    "{}/v2/{}/",
                    host.as_str().trim_end_matches('/'),
                    reference.repository
                ),
                server: server(host),
            })
            .collect()
    }

    fn url_mirrors(&self, artifact_url: &str) -> Vec<Candidate> {
        let Ok(url) = Url::parse(artifact_url) else {
            return Vec::new();
        };
        let best = self
            .rules
            .iter()
            .filter_map(|rule| match &rule.scope {
                Scope::UrlPrefix(prefix) => Some((rule, prefix, prefix.remainder(&url)?)),
                Scope::Registry(_) => None,
            })
            .max_by_key(|(_, prefix, _)| prefix.to_string().len());
        let Some((rule, _, rest)) = best else {
            return Vec::new();
        };
        rule.hosts
            .iter()
            .map(|host| Candidate::Mirror {
                url: format!("{}{rest}", host.as_str()),
                server: server(host),
            })
            .collect()
    }
}

/// `host[:port]` of `url` (the port only when written), as Docker config keys name it.
fn server(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn rule(registry: Option<&str>, prefix: Option<&str>, hosts: &[&str]) -> MirrorRule {
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        MirrorRule::new(registry.map(Into::into), prefix.map(Into::into), &hosts).unwrap()
    }

    fn mirror(url: &str, server: &str) -> Candidate {
        Candidate::Mirror {
            url: url.into(),
            server: server.into(),
        }
    }

    #[test]
    fn a_registrys_mirrors_come_in_order_then_the_origin() {
        let mirrors = Mirrors::new(vec![rule(
            Some("registry.example"),
            None,
            &["https://m1.example:5000", "http://10.0.0.7/cache/"],
        )])
        .unwrap();
        let url = format!("oci://registry.example/sysext/kubelet:v1@sha256:{D}");
        assert_eq!(
            mirrors.candidates(&url),
            [
                mirror(
                    "https://m1.example:5000/v2/sysext/kubelet/",
                    "m1.example:5000"
                ),
                mirror("http://10.0.0.7/cache/v2/sysext/kubelet/", "10.0.0.7"),
                Candidate::Origin,
            ]
        );
        let other = format!("oci://other.example/sysext/kubelet@sha256:{D}");
        assert_eq!(mirrors.candidates(&other), [Candidate::Origin]);
    }

    #[test]
    fn an_http_artifact_takes_the_longest_prefixs_mirrors() {
        let mirrors = Mirrors::new(vec![
            rule(
                None,
                Some("https://dl.example/"),
                &["https://all.example/dl/"],
            ),
            rule(
                None,
                Some("https://dl.example/releases/"),
                &["https://a.example/r/", "https://b.example/"],
            ),
        ])
        .unwrap();
        assert_eq!(
            mirrors.candidates("https://dl.example/releases/v1/k%20s.raw?x=1"),
            [
                mirror("https://a.example/r/v1/k%20s.raw?x=1", "a.example"),
                mirror("https://b.example/v1/k%20s.raw?x=1", "b.example"),
                Candidate::Origin,
            ]
        );
        assert_eq!(
            mirrors.candidates("https://dl.example/other.raw"),
            [
                mirror("https://all.example/dl/other.raw", "all.example"),
                Candidate::Origin
            ]
        );
        // Compared by segments, not strings: not under the prefix.
        assert_eq!(
            mirrors.candidates("https://dl.example.attacker.net/releases/x.raw"),
            [Candidate::Origin]
        );
        assert_eq!(
            Mirrors::default().candidates("https://dl.example/x"),
            [Candidate::Origin]
        );
    }

    #[test]
    fn broken_rules_are_refused_naming_the_key() {
        let err = |registry: Option<&str>, prefix: Option<&str>, hosts: &[&str]| {
            let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
            MirrorRule::new(registry.map(Into::into), prefix.map(Into::into), &hosts)
                .unwrap_err()
                .0
        };
        assert_eq!(err(None, None, &["https://m/"]), "registry");
        assert_eq!(
            err(Some("r.example"), Some("https://x/"), &["https://m/"]),
            "registry"
        );
        assert_eq!(err(Some("R.example"), None, &["https://m/"]), "registry");
        assert_eq!(
            err(None, Some("https://x/dir"), &["https://m/"]),
            "url_prefix"
        );
        assert_eq!(err(Some("r.example"), None, &[]), "hosts");
        assert_eq!(
            err(Some("r.example"), None, &["https://m/", "ftp://m/"]),
            "hosts[1]"
        );
        assert_eq!(
            err(Some("r.example"), None, &["https://u:p@m/"]),
            "hosts[0]"
        );
        // Under a prefix a mirror is a prefix too: the file name is appended to it.
        assert_eq!(
            err(None, Some("https://x/"), &["https://m/dir"]),
            "hosts[0]"
        );
        let twice = Mirrors::new(vec![
            rule(Some("r.example"), None, &["https://a/"]),
            rule(Some("r.example"), None, &["https://b/"]),
        ]);
        assert_eq!(twice.unwrap_err().0, 1);
    }
}
