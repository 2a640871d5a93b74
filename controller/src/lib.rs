//! The inplace controller: validates NodeReleases, and turns NodeRollouts into per-node
//! NodeUpdatePlans, a few activation slots at a time.
//!
//! The rollout's rules are one pure function ([`decision::decide`]); everything else here
//! gathers its inputs from watch caches and carries out its actions.

pub mod decision;
