//! Spawning processes under pwrun (`spawn`, `spawn_multiple`, MPI's `MPI_Comm_spawn`): the
//! launcher starts the new processes as a job of their own and a connection job between them
//! and the spawning group; point-to-point calls on the intercommunicator cross between the
//! groups, `merge` makes one communicator of both, and a failure on either side is the
//! launch's failure.

use std::process::Command;

use pagewire::topology::MergeOrder;
use pagewire::traits::*;
use pagewire::{ErrorClass, SystemOperation};
use pagewire_test_support::facade::launch;
use pagewire_test_support::ROLE;

/// The variable that tells a spawned copy of a test which command it runs.
const ARG: &str = "SPAWN_TEST_COMMAND";

/// A copy of this test binary that runs test `name` as a spawned process of command `arg`.
fn spawned_copy(name: &str, arg: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current_exe"));
    c.args([name, "--exact", "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE, format!("{name}:spawned"))
        .env(ARG, arg);
    c
}

/// Two parents spawn two processes of one command and one of another; every parent and
/// child exchange a message both ways on the intercommunicator (statuses name the other
/// group's ranks), the children also talk among themselves, and the merged communicator
/// orders the parents first and reduces over all five.
#[test]
fn spawned_processes_talk_to_their_parents_and_merge_with_them() {
    let name = "spawned_processes_talk_to_their_parents_and_merge_with_them";
    let role = std::env::var(ROLE).unwrap_or_default();
    if role == format!("{name}:spawned") {
        let universe = pagewire::initialize().expect("first initialisation");
        let world = universe.world();
        let me = world.rank();
        let appnum = universe.appnum().expect("a spawned process has an appnum");
        let command = std::env::var(ARG).expect("the command's name");
        assert_eq!(
            (command.as_str(), appnum),
            (["first", "second"][appnum as usize], appnum)
        );
        assert_eq!(world.size(), 3);
        let parent = world.parent().expect("a spawned process has a parent");
        assert_eq!(
            (parent.rank(), parent.size(), parent.remote_size()),
            (me, 3, 2)
        );
        for p in 0..2 {
            let (v, status) = parent.process_at_rank(p).receive::<i32>();
            assert_eq!((v, status.source_rank()), (p * 100 + me, p));
        }
        for p in 0..2 {
            parent.process_at_rank(p).send(&(me * 10 + appnum));
        }
        let mut children = 0;
        world.all_reduce_into(&1i32, &mut children, SystemOperation::sum());
        assert_eq!(children, 3);
        let merged = parent.merge(MergeOrder::High);
        assert_eq!((merged.rank(), merged.size()), (2 + me, 5));
        let mut sum = 0;
        merged.all_reduce_into(&merged.rank(), &mut sum, SystemOperation::sum());
        assert_eq!(sum, 10);
        return;
    }
    if role == name {
        let universe = pagewire::initialize().expect("first initialisation");
        let world = universe.world();
        assert!(world.parent().is_none());
        assert_eq!(universe.appnum(), None);
        let me = world.rank();
        let commands = [spawned_copy(name, "first"), spawned_copy(name, "second")];
        let inter = world
            .process_at_rank(0)
            .spawn_multiple(&commands, &[2, 1])
            .expect("spawn under pwrun");
        assert_eq!(
            (inter.rank(), inter.size(), inter.remote_size()),
            (me, 2, 3)
        );
        for c in 0..3 {
            inter.process_at_rank(c).send(&(me * 100 + c));
        }
        let mut seen = [false; 3];
        for _ in 0..3 {
            let (v, status) = inter.any_process().receive::<i32>();
            let c = status.source_rank();
            assert_eq!(v, c * 10 + i32::from(c == 2), "from child {c}");
            seen[c as usize] = true;
        }
        assert_eq!(seen, [true; 3]);
        // Collectives on the intercommunicator itself are not done here: merge first.
        let mut sum = 0;
        let e = inter
            .try_all_reduce_into(&1i32, &mut sum, SystemOperation::sum())
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::UnsupportedOperation, "{e}");
        assert!(e.to_string().contains("merge it"), "{e}");
        let merged = inter.merge(MergeOrder::Low);
        assert_eq!((merged.rank(), merged.size()), (me, 5));
        let mut sum = 0;
        merged.all_reduce_into(&merged.rank(), &mut sum, SystemOperation::sum());
        assert_eq!(sum, 10);
        world.barrier();
        return;
    }
    let o = launch(name, 2, &[]);
    assert!(o.success(), "{o:?}");
}

/// A program that cannot be started is an error on every rank of the spawning group (one
/// line naming it), and the job goes on.
#[test]
fn spawn_of_a_missing_program_fails_on_every_rank_and_the_job_goes_on() {
    let name = "spawn_of_a_missing_program_fails_on_every_rank_and_the_job_goes_on";
    if std::env::var(ROLE).as_deref() == Ok(name) {
        let universe = pagewire::initialize().expect("first initialisation");
        let world = universe.world();
        let missing = Command::new("/nonexistent/pagewire-child");
        let e = world.process_at_rank(1).spawn(&missing, 2).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("cannot start /nonexistent/pagewire-child") && !text.contains('\n'),
            "{text}"
        );
        let e = world
            .process_at_rank(0)
            .spawn_multiple(&[Command::new("/bin/true")], &[0])
            .unwrap_err();
        assert!(e.to_string().contains("one count of at least 1"), "{e}");
        let mut n = 0;
        world.all_reduce_into(&1i32, &mut n, SystemOperation::sum());
        assert_eq!(n, 3);
        return;
    }
    let o = launch(name, 3, &[]);
    assert!(o.success(), "{o:?}");
}

/// A spawned process that exits non-zero fails the launch with its code, and the parents,
/// waiting for it, are stopped.
#[test]
fn a_failing_spawned_process_fails_the_launch_with_its_code() {
    let name = "a_failing_spawned_process_fails_the_launch_with_its_code";
    let role = std::env::var(ROLE).unwrap_or_default();
    if role == format!("{name}:spawned") {
        let universe = pagewire::initialize().expect("first initialisation");
        assert!(universe.world().parent().is_some());
        std::process::exit(3);
    }
    if role == name {
        let universe = pagewire::initialize().expect("first initialisation");
        let world = universe.world();
        let inter = world
            .process_at_rank(0)
            .spawn(&spawned_copy(name, "failing"), 1)
            .expect("spawn under pwrun");
        // Never sent: the child exits instead.
        let _ = inter.process_at_rank(0).receive::<i32>();
        return;
    }
    let t0 = std::time::Instant::now();
    let o = launch(name, 2, &[]);
    assert_eq!((o.exit_code, o.failed_rank), (3, None), "{o:?}");
    assert!(t0.elapsed().as_secs() < 60, "took {:?}", t0.elapsed());
}
