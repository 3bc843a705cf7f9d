//! The conformance suite: every test body is written once, as `fn(&Ctx)` in one of the modules
//! below, and [`conformance!`] instantiates it once per backend, as `gvisor::<name>` and
//! `microvm::<name>`.
//!
//! One `#[test]` per body and backend (rather than one test per backend looping over the
//! bodies) keeps each a test of its own: the harness runs them in parallel, a failure names the
//! backend and the behaviour, one backend or one test is picked with the usual filter
//! (`cargo test -p branchbox-conformance gvisor::`), and every test's time is reported alone.
//! A backend this host cannot run prints one `SKIP <backend> <test>: <what the host lacks>`
//! line per test instead (`branchbox_conformance::missing` decides, for all of them).

mod errors;
mod exec;
mod files;
mod fork;
mod limits;
mod lineage;
mod travel;

/// Declares `gvisor::$name` and `microvm::$name` for each `$module::$name` body.
macro_rules! conformance {
    ($($module:ident :: $name:ident),+ $(,)?) => {
        mod gvisor {
            $(
                #[test]
                fn $name() {
                    branchbox_conformance::conform(
                        branchbox_conformance::Backend::Gvisor,
                        stringify!($name),
                        crate::$module::$name,
                    );
                }
            )+
        }
        mod microvm {
            $(
                #[test]
                fn $name() {
                    branchbox_conformance::conform(
                        branchbox_conformance::Backend::Microvm,
                        stringify!($name),
                        crate::$module::$name,
                    );
                }
            )+
        }
    };
}

conformance! {
    exec::exit_codes_and_output_come_back_separately,
    exec::environment_working_directory_and_stdin_reach_the_command,
    exec::a_timeout_kills_the_whole_process_group,
    exec::output_above_the_cap_is_cut_and_reported,
    exec::a_paused_sandbox_refuses_exec_until_resumed,
    files::put_get_and_ls_round_trip,
    files::a_big_binary_file_round_trips_byte_exact,
    files::refused_paths_get_clear_errors_and_write_nothing,
    limits::a_memory_hog_is_killed_and_the_sandbox_keeps_answering,
    limits::forks_past_the_process_limit_fail_with_eagain,
    fork::children_continue_the_running_process_and_keep_their_writes_apart,
    travel::a_snapshot_restores_with_files_and_memory_after_its_source_is_gone,
    travel::rollback_returns_files_memory_and_processes_to_the_checkpoint,
    lineage::log_and_ls_record_each_sandboxs_parent,
    errors::unknown_and_malformed_ids_get_clear_errors,
    errors::bad_snapshots_get_clear_errors_and_change_nothing,
    errors::a_killed_sandbox_refuses_every_command_clearly,
}
