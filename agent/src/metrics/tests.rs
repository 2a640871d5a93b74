use super::*;

/// Feeds reports one second apart; returns the metrics.
fn replay(reports: &[(Option<&str>, Phase, Reason)]) -> AgentMetrics {
    let metrics = AgentMetrics::default();
    let t0 = Instant::now();
    for (i, (revision, phase, reason)) in reports.iter().enumerate() {
        let offset = Duration::from_secs(i as u64);
        metrics.reported(
            Reported {
                revision: *revision,
                phase: *phase,
                reason: *reason,
            },
            t0 + offset,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_000) + offset,
        );
    }
    metrics
}

fn line(text: &str, prefix: &str) -> String {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_default()
        .to_owned()
}

const A: Option<&str> = Some("aaaa");
const B: Option<&str> = Some("bbbb");

#[test]
fn an_update_times_each_phase_and_counts_once_despite_repeats() {
    let m = replay(&[
        (A, Phase::Downloading, Reason::Downloading),
        (A, Phase::Downloading, Reason::Downloading), // progress
        (A, Phase::Downloading, Reason::Downloading), // progress
        (A, Phase::Activating, Reason::Activating),
        (A, Phase::Verifying, Reason::Verifying),
        (A, Phase::Succeeded, Reason::Succeeded),
        (A, Phase::Succeeded, Reason::Succeeded), // a relist
    ]);
    let text = m.render();
    // Downloading lasted from t0 to t0+3s: the 5 s bucket, not the 2.5 s one.
    assert_eq!(
        line(
            &text,
            "inplace_agent_step_duration_seconds_sum{step=\"stage\"}"
        ),
        "inplace_agent_step_duration_seconds_sum{step=\"stage\"} 3.0"
    );
    assert!(text.contains("step_duration_seconds_bucket{step=\"stage\",le=\"2.5\"} 0\n"));
    assert!(text.contains("step_duration_seconds_bucket{step=\"stage\",le=\"5\"} 1\n"));
    assert!(text.contains("step_duration_seconds_sum{step=\"activate\"} 1.0\n"));
    assert!(text.contains("step_duration_seconds_sum{step=\"health\"} 1.0\n"));
    assert!(text.contains("inplace_agent_updates_total{result=\"succeeded\"} 1\n"));
    assert!(text.contains("inplace_agent_phase{phase=\"Succeeded\"} 1\n"));
    assert!(text.contains("inplace_agent_phase{phase=\"Verifying\"} 0\n"));
    // The last change was the Succeeded at t0+5s.
    assert!(text.contains("inplace_agent_last_transition_timestamp_seconds 1005.0\n"));
    assert!(!text.contains("inplace_agent_failures_total{"), "{text}");
}

#[test]
fn restating_an_old_result_after_a_restart_counts_nothing() {
    let m = replay(&[
        (A, Phase::Succeeded, Reason::Succeeded),
        (A, Phase::RolledBack, Reason::RolledBack),
        (B, Phase::Failed, Reason::RevisionDenied),
        (B, Phase::Failed, Reason::RollbackFailed),
    ]);
    let text = m.render();
    for result in RESULTS {
        assert!(text.contains(&format!("updates_total{{result=\"{result}\"}} 0\n")));
    }
    assert!(!text.contains("inplace_agent_failures_total{"), "{text}");
    assert!(!text.contains("step_duration_seconds_count"), "{text}");
}

#[test]
fn a_rollback_counts_its_cause_and_a_failed_one_also_rollback_failed() {
    let m = replay(&[
        (A, Phase::Downloading, Reason::Downloading),
        (A, Phase::Activating, Reason::Activating),
        (A, Phase::Verifying, Reason::Verifying),
        (A, Phase::RollingBack, Reason::HealthCheckFailed),
        (A, Phase::RolledBack, Reason::RolledBack),
        (B, Phase::Downloading, Reason::Downloading),
        (B, Phase::Activating, Reason::Activating),
        (B, Phase::RollingBack, Reason::UnitFailed),
        (B, Phase::Failed, Reason::RollbackFailed),
    ]);
    let text = m.render();
    assert!(
        text.contains("updates_total{result=\"rolled_back\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("updates_total{result=\"failed\"} 1\n"),
        "{text}"
    );
    assert!(text.contains("failures_total{reason=\"HealthCheckFailed\"} 1\n"));
    assert!(text.contains("failures_total{reason=\"UnitFailed\"} 1\n"));
    assert!(text.contains("failures_total{reason=\"RollbackFailed\"} 1\n"));
    assert!(text.contains("step_duration_seconds_count{step=\"rollback\"} 2\n"));
}

#[test]
fn refusals_and_staging_failures_count_by_reason() {
    let m = replay(&[
        (A, Phase::Failed, Reason::PolicyDenied),
        (A, Phase::Failed, Reason::PolicyDenied),
        (B, Phase::Downloading, Reason::Downloading),
        (B, Phase::Failed, Reason::HashMismatch),
        (B, Phase::Failed, Reason::RevisionDenied),
        (A, Phase::Failed, Reason::PolicyDenied),
        (B, Phase::Failed, Reason::DowngradeDenied),
    ]);
    let text = m.render();
    assert!(
        text.contains("failures_total{reason=\"DowngradeDenied\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("failures_total{reason=\"PolicyDenied\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("failures_total{reason=\"HashMismatch\"} 1\n"),
        "{text}"
    );
    assert!(!text.contains("reason=\"RevisionDenied\""), "{text}");
    assert!(
        text.contains("updates_total{result=\"failed\"} 1\n"),
        "{text}"
    );
}

#[test]
fn a_superseded_staging_is_not_timed_as_a_stage() {
    let m = replay(&[
        (A, Phase::Downloading, Reason::Downloading),
        (B, Phase::Downloading, Reason::Downloading),
        (B, Phase::Staged, Reason::Staged),
    ]);
    let text = m.render();
    assert!(text.contains("step_duration_seconds_count{step=\"stage\"} 1\n"));
    assert!(
        text.contains("step_duration_seconds_sum{step=\"stage\"} 1.0\n"),
        "{text}"
    );
}

#[test]
fn revision_info_and_downloads() {
    let m = AgentMetrics::default();
    m.running(Some("6c1f\"0a"), Some("v1.31.2"));
    {
        let d = m.download();
        d.progress(100);
        d.progress(40); // a retry that starts over
        d.progress(140);
        d.succeeded();
    }
    {
        let d = m.download();
        d.progress(7); // then abandoned
    }
    let text = m.render();
    assert!(text.contains(
        "inplace_agent_revision_info{revision=\"6c1f\\\"0a\",kubernetes_version=\"v1.31.2\"} 1\n"
    ));
    assert!(
        text.contains("inplace_agent_downloaded_bytes_total 247\n"),
        "{text}"
    );
    assert!(text.contains("step_duration_seconds_count{step=\"download\"} 1\n"));
    m.running(None, None);
    assert!(!m.render().contains("inplace_agent_revision_info{"));
}
