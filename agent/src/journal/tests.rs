//! The journal's transitions, refusals and file handling.

use std::path::Path;

use super::*;

fn content() -> UpdateContent {
    serde_json::from_value(serde_json::json!({
        "artifacts": [{"name": "k", "type": "Sysext", "url": "https://x/k.raw",
                       "sha256": "0".repeat(64)}]
    }))
    .unwrap()
}

fn flight(rev: &str) -> InFlight {
    InFlight {
        revision: rev.into(),
        generation: Some(1),
        content: content(),
        step: Step::Verifying,
        links: vec![Link {
            path: "/etc/extensions/k.raw".into(),
            target: format!("/opt/extensions/k/{rev}.raw").into(),
            sha256: "0".repeat(64),
        }],
        before: vec![],
        failure: None,
        started_at: Utc::now(),
        switch: None,
        reboot: None,
    }
}

#[tokio::test]
async fn round_trip_and_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = JournalFile::new(dir.path());
    assert_eq!(file.load().await.unwrap(), Journal::default());
    let mut j = Journal {
        in_flight: Some(flight("a")),
        ..Default::default()
    };
    j.attempts.insert("a".into(), 2);
    file.save(&j).await.unwrap();
    assert_eq!(file.load().await.unwrap(), j);
    // Only the journal itself is left: the temporary name was renamed away.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec!["journal.json"]);
}

#[tokio::test]
async fn crash_before_rename_keeps_the_old_journal() {
    let dir = tempfile::tempdir().unwrap();
    let file = JournalFile::new(dir.path());
    let old = Journal {
        in_flight: Some(flight("old")),
        ..Default::default()
    };
    file.save(&old).await.unwrap();
    // A crash after writing the temporary file, before the rename.
    std::fs::write(dir.path().join(".journal.json.inplace-new"), b"{\"trunc").unwrap();
    assert_eq!(file.load().await.unwrap(), old);
    // The next save goes through despite the leftover.
    file.save(&Journal::default()).await.unwrap();
    assert_eq!(file.load().await.unwrap(), Journal::default());
}

/// The steps of a durable write as they reach the file system, done for real by `StdFs`.
#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<String>>);

impl Recorder {
    fn note(&self, step: &str, path: &std::path::Path) {
        let name = path.file_name().unwrap().to_string_lossy();
        self.0.lock().unwrap().push(format!("{step} {name}"));
    }
}

impl crate::links::DurableOps for Recorder {
    fn write(&self, path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
        self.note("write", path);
        crate::links::StdFs.write(path, bytes)
    }
    fn fsync_file(&self, path: &std::path::Path) -> std::io::Result<()> {
        self.note("fsync", path);
        crate::links::StdFs.fsync_file(path)
    }
    fn rename(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        self.note("rename", from);
        self.note("  to", to);
        crate::links::StdFs.rename(from, to)
    }
    fn fsync_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        self.note("fsync-dir", dir);
        crate::links::StdFs.fsync_dir(dir)
    }
}

/// A save is durable only in this order: the content reaches the disk before the rename
/// names it (else a power loss can leave journal.json empty), and the rename reaches the
/// disk before `save` returns (else the old journal can come back after a step was acted
/// on). Removing any fsync, or moving it after the rename, fails here.
#[tokio::test]
async fn a_save_writes_fsyncs_renames_then_fsyncs_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let recorder = std::sync::Arc::new(Recorder::default());
    let file = JournalFile::with_ops(&state, recorder.clone());
    let journal = Journal {
        in_flight: Some(flight("r1")),
        ..Default::default()
    };
    file.save(&journal).await.unwrap();
    let steps = recorder.0.lock().unwrap().clone();
    assert_eq!(
        steps,
        vec![
            "write .journal.json.inplace-new",
            "fsync .journal.json.inplace-new",
            "rename .journal.json.inplace-new",
            "  to journal.json",
            "fsync-dir state",
        ],
    );
    assert_eq!(JournalFile::new(&state).load().await.unwrap(), journal);
}

#[tokio::test]
async fn corrupt_journal_is_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let file = JournalFile::new(dir.path());
    std::fs::write(dir.path().join("journal.json"), b"not json").unwrap();
    let err = file.load().await.unwrap_err();
    assert!(matches!(err, JournalError::Corrupt { .. }), "{err}");
    assert_eq!(file.load().await.unwrap(), Journal::default());
}

fn failure(reason: Reason) -> Failure {
    Failure {
        reason,
        message: format!("{reason} here"),
    }
}

/// A journal whose in-flight revision reached `step` through the transitions (one
/// activation attempt once activating; rolled back for `HealthCheckFailed`).
pub(crate) fn at_step(revision: &str, content: &UpdateContent, step: Step) -> Journal {
    let mut j = Journal::default();
    j.begin_staging(revision, Some(1), content, Utc::now())
        .unwrap();
    if step != Step::Staging {
        j.staged(flight(revision).links).unwrap();
    }
    if matches!(step, Step::Activating | Step::Verifying | Step::RollingBack) {
        j.count_attempt().unwrap();
        j.activating(vec![]).unwrap();
    }
    if matches!(step, Step::Verifying | Step::RollingBack) {
        j.verifying().unwrap();
    }
    if step == Step::RollingBack {
        j.rolling_back(Some(failure(Reason::HealthCheckFailed)))
            .unwrap();
    }
    assert_eq!(j.step(), Some(step));
    j
}

fn at(revision: &str, step: Step) -> Journal {
    at_step(revision, &content(), step)
}

#[test]
fn a_revision_is_staged_activated_verified_and_committed() {
    let mut j = at("a", Step::Staged);
    assert_eq!(j.in_flight().unwrap().links(), flight("a").links);
    assert_eq!(j.count_attempt(), Ok(1));
    let prior = Before {
        path: "/etc/extensions/k.raw".into(),
        prior: Prior::Absent,
    };
    assert_eq!(j.activating(vec![prior.clone()]), Ok(vec![]));
    assert_eq!(j.in_flight().unwrap().before(), [prior]);
    j.verifying().unwrap();
    assert_eq!(j.commit(Utc::now()), Ok(None));
    assert_eq!(j.current_revision(), Some("a"));
    assert_eq!(
        j.attempts("a"),
        Some(1),
        "the committed revision's count stays"
    );
    assert!(j.in_flight().is_none());
}

#[test]
fn a_resumed_activation_keeps_its_priors_and_counts_attempts() {
    let mut j = at("a", Step::Staged);
    j.count_attempt().unwrap();
    let dropped = Before {
        path: "/opt/bin/crictl".into(),
        prior: Prior::Symlink {
            target: "/store/c1".into(),
        },
    };
    let removals = j.activating(vec![dropped.clone()]).unwrap();
    assert_eq!(removals, vec![PathBuf::from("/opt/bin/crictl")]);
    j.verifying().unwrap();
    // A restart in the health window.
    assert_eq!(j.count_attempt(), Ok(2));
    assert_eq!(j.resume_activating(), Ok(removals));
    assert_eq!(j.step(), Some(Step::Activating));
    assert_eq!(j.in_flight().unwrap().before(), [dropped]);
    assert_eq!(j.attempts("a"), Some(2));
}

#[test]
fn a_failed_revision_is_rolled_back_and_denied() {
    let mut j = at("a", Step::Verifying);
    let why = failure(Reason::HealthCheckFailed);
    let flight = j.rolling_back(Some(why.clone())).unwrap();
    assert_eq!(flight.failure(), Some(&why));
    // A restart mid-rollback goes on with the same failure.
    j.rolling_back(Some(why.clone())).unwrap();
    let flight = j.rolled_back(Utc::now()).unwrap();
    assert_eq!(flight.revision(), "a");
    let denied = j.failure_of("a").unwrap();
    assert_eq!(denied.failure(), &why);
    assert!(denied.rolled_back());
    assert_eq!(j.attempts("a"), None);
    assert!(j.in_flight().is_none() && j.degraded().is_none());
}

#[test]
fn a_superseded_rollback_denies_nothing() {
    let mut j = at("a", Step::Activating);
    j.rolling_back(None).unwrap();
    j.rolled_back(Utc::now()).unwrap();
    assert!(j.failed().is_empty());
    assert!(j.in_flight().is_none());
}

#[test]
fn a_failed_rollback_degrades_the_node() {
    let mut j = at("a", Step::RollingBack);
    let degraded = failure(Reason::RollbackFailed);
    j.rollback_failed(degraded.clone(), Utc::now()).unwrap();
    assert_eq!(j.degraded(), Some(&degraded));
    let denied = j.failure_of("a").unwrap();
    assert!(!denied.rolled_back());
    assert_eq!(denied.failure().reason, Reason::HealthCheckFailed);
    assert_eq!(j.clear_degraded(), Some(degraded));
    assert_eq!(j.degraded(), None);
}

#[test]
fn a_staging_is_denied_or_abandoned() {
    for step in [Step::Staging, Step::Staged] {
        let mut j = at("a", step);
        let why = failure(Reason::HashMismatch);
        assert_eq!(j.deny(why.clone(), Utc::now()).unwrap().revision(), "a");
        assert_eq!(j.failure_of("a").unwrap().failure(), &why);
        assert!(j.in_flight().is_none());

        let mut j = at("b", step);
        assert_eq!(j.abandon_staging().unwrap().revision(), "b");
        assert!(j.in_flight().is_none() && j.failed().is_empty());
    }
}

#[test]
fn impossible_transitions_are_refused_and_change_nothing() {
    type Transition = fn(&mut Journal) -> Result<(), TransitionError>;
    use Step::*;
    let transitions: [(&str, Transition, &[Step]); 12] = [
        (
            "begin_staging",
            |j| j.begin_staging("n", None, &content(), Utc::now()),
            &[],
        ),
        ("staged", |j| j.staged(vec![]), &[Staging, Staged]),
        (
            "abandon_staging",
            |j| j.abandon_staging().map(drop),
            &[Staging, Staged],
        ),
        (
            "deny",
            |j| j.deny(failure(Reason::UnitFailed), Utc::now()).map(drop),
            &[Staging, Staged],
        ),
        (
            "count_attempt",
            |j| j.count_attempt().map(drop),
            &[Staged, Activating, Verifying],
        ),
        ("activating", |j| j.activating(vec![]).map(drop), &[Staged]),
        (
            "resume_activating",
            |j| j.resume_activating().map(drop),
            &[Activating, Verifying],
        ),
        ("verifying", Journal::verifying, &[Activating]),
        ("commit", |j| j.commit(Utc::now()).map(drop), &[Verifying]),
        (
            "rolling_back",
            |j| j.rolling_back(Some(failure(Reason::UnitFailed))).map(drop),
            &[Activating, Verifying, RollingBack],
        ),
        (
            "rolled_back",
            |j| j.rolled_back(Utc::now()).map(drop),
            &[RollingBack],
        ),
        (
            "rollback_failed",
            |j| {
                j.rollback_failed(failure(Reason::UnitFailed), Utc::now())
                    .map(drop)
            },
            &[RollingBack],
        ),
    ];
    let mut refused = 0;
    for from in [
        None,
        Some(Staging),
        Some(Staged),
        Some(Activating),
        Some(Verifying),
        Some(RollingBack),
    ] {
        for (name, transition, allowed) in &transitions {
            let mut j = match from {
                None => Journal::default(),
                Some(step) => at("a", step),
            };
            let was = j.clone();
            let possible = from.map_or(*name == "begin_staging", |s| allowed.contains(&s));
            match transition(&mut j) {
                Ok(()) => assert!(possible, "{name} from {from:?} went through"),
                Err(e) => {
                    assert!(!possible, "{name} from {from:?} refused: {e}");
                    assert_eq!(
                        e,
                        TransitionError {
                            transition: name,
                            from
                        }
                    );
                    assert_eq!(j, was, "a refused {name} changed the journal");
                    refused += 1;
                }
            }
        }
    }
    // 72 pairs, 20 of them possible.
    assert_eq!(refused, 52);
}

#[test]
fn a_refusal_names_the_transition_and_the_step() {
    let e = TransitionError {
        transition: "commit",
        from: Some(Step::Staged),
    };
    assert_eq!(
        e.to_string(),
        "journal: `commit` is impossible from step Staged"
    );
    let e = TransitionError {
        transition: "verifying",
        from: None,
    };
    assert_eq!(
        e.to_string(),
        "journal: `verifying` is impossible from nothing in flight"
    );
}

#[test]
fn commit_shifts_revisions_and_clears_failures() {
    let mut j = at("bad", Step::Staging);
    j.deny(failure(Reason::UnitFailed), Utc::now()).unwrap();
    for rev in ["a", "b"] {
        j.in_flight = Some(flight(rev));
        assert!(j.commit(Utc::now()).unwrap().is_none());
    }
    j.in_flight = Some(flight("c"));
    let dropped = j.commit(Utc::now()).unwrap().unwrap();
    assert_eq!(dropped.revision(), "a");
    assert_eq!(j.current_revision(), Some("c"));
    assert_eq!(j.previous().unwrap().revision(), "b");
    assert!(j.failed().is_empty());
    assert!(j.in_flight().is_none());
}

fn link(path: &str, target: &str) -> Link {
    Link {
        path: path.into(),
        target: target.into(),
        sha256: "0".repeat(64),
    }
}

#[test]
fn retired_are_the_committed_links_the_next_revision_drops_and_still_ours() {
    let committed = [
        link("/etc/extensions/k.raw", "/opt/extensions/k/1.raw"),
        link("/etc/extensions/tools.raw", "/opt/extensions/tools/1.raw"),
        link("/opt/bin/crictl", "/store/c1"),
        link("/opt/bin/ctr", "/store/ctr1"),
    ];
    let next = [link("/etc/extensions/k.raw", "/opt/extensions/k/2.raw")];
    // Someone replaced /opt/bin/ctr since: it is not the agent's any more.
    let retired = retired(&committed, &next, |l| l.path != Path::new("/opt/bin/ctr"));
    let expected: Vec<Before> = committed[1..3]
        .iter()
        .map(|l| Before {
            path: l.path.clone(),
            prior: Prior::Symlink {
                target: l.target.clone(),
            },
        })
        .collect();
    assert_eq!(retired, expected);
    // A revision that keeps every path retires nothing; a first install has nothing.
    assert!(super::retired(&committed, &committed, |_| true).is_empty());
    assert!(super::retired(&[], &next, |_| true).is_empty());
}

#[test]
fn removals_are_the_recorded_paths_the_flight_does_not_link() {
    let mut f = flight("b");
    assert!(f.removals().is_empty());
    f.before = vec![
        Before {
            path: "/etc/extensions/k.raw".into(),
            prior: Prior::Absent,
        },
        Before {
            path: "/opt/bin/crictl".into(),
            prior: Prior::Symlink {
                target: "/store/c1".into(),
            },
        },
    ];
    assert_eq!(f.removals(), vec![PathBuf::from("/opt/bin/crictl")]);
}

#[test]
fn denylist_is_bounded() {
    let mut j = Journal::default();
    for i in 0..40 {
        let rev = format!("r{i}");
        j.begin_staging(&rev, None, &content(), Utc::now()).unwrap();
        j.deny(failure(Reason::UnitFailed), Utc::now()).unwrap();
    }
    assert_eq!(j.failed().len(), MAX_FAILED);
    assert!(j.failure_of("r39").is_some());
    assert!(j.failure_of("r0").is_none());
}

#[test]
fn a_retry_forgets_the_revisions_failure_and_remembers_its_token() {
    let mut j = at("a", Step::RollingBack);
    j.rolling_back(Some(failure(Reason::HealthCheckFailed)))
        .unwrap();
    j.rolled_back(Utc::now()).unwrap();
    let mut b = at("b", Step::Staging);
    b.deny(failure(Reason::HashMismatch), Utc::now()).unwrap();
    j.failed.extend(b.failed);

    let forgotten = j.honour_retry("t1", "a").unwrap();
    assert_eq!(forgotten.revision(), "a");
    assert!(j.failure_of("a").is_none());
    assert!(
        j.failure_of("b").is_some(),
        "only the retried revision is forgotten"
    );
    assert_eq!(j.retry_honoured(), Some("t1"));
    // A token for a revision that never failed is still remembered (and honoured once).
    assert_eq!(j.honour_retry("t2", "c"), None);
    assert_eq!(j.retry_honoured(), Some("t2"));
}

#[tokio::test]
async fn an_honoured_retry_token_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = JournalFile::new(dir.path());
    let mut j = at("a", Step::Staging);
    j.deny(failure(Reason::HashMismatch), Utc::now()).unwrap();
    j.honour_retry("t1", "a");
    file.save(&j).await.unwrap();
    let loaded = file.load().await.unwrap();
    assert_eq!(loaded.retry_honoured(), Some("t1"));
    assert!(loaded.failure_of("a").is_none());
}
