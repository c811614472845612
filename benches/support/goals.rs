//! The goals the rows are held to, each recorded as its row is measured
//! and printed first, met or not, so that one run of `scripts/bench` says
//! which goals hold on this machine without anyone reading the table.

use std::sync::Mutex;

/// One goal, as one row measured it.
struct Goal {
    what: String,
    now: String,
    goal: String,
    met: bool,
}

static GOALS: Mutex<Vec<Goal>> = Mutex::new(Vec::new());

/// The goal `goal` of the row `what`, measured as `now`.
pub fn record(what: &str, now: String, goal: &str, met: bool) {
    GOALS.lock().unwrap().push(Goal {
        what: what.to_owned(),
        now,
        goal: goal.to_owned(),
        met,
    });
}

/// A ratio as the table shows it: enough digits that a ratio just past
/// its goal never reads as the goal itself.
fn ratio(r: f64) -> String {
    if r < 0.1 {
        format!("{r:.4}x")
    } else {
        format!("{r:.3}x")
    }
}

/// A ratio that should be at most `most`.
pub fn at_most(what: &str, ratio_now: f64, most: f64) {
    record(
        what,
        ratio(ratio_now),
        &format!("{most}x at most"),
        ratio_now <= most,
    );
}

/// A ratio that should be at least `least` (throughputs).
pub fn at_least(what: &str, ratio_now: f64, least: f64) {
    record(
        what,
        ratio(ratio_now),
        &format!("{least}x at least"),
        ratio_now >= least,
    );
}

/// The goals recorded, as a table (nothing when no row had one).
pub fn table() -> String {
    let goals = GOALS.lock().unwrap();
    if goals.is_empty() {
        return String::new();
    }
    let met = goals.iter().filter(|g| g.met).count();
    let mut out = format!(
        "Goals: {met} of {} met in this run.\n\n| goal | now | held to | met |\n|---|---|---|---|\n",
        goals.len()
    );
    for g in goals.iter() {
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            g.what,
            g.now,
            g.goal,
            if g.met { "yes" } else { "**no**" }
        ));
    }
    out
}
