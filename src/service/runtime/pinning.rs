//! Where each executor runs (`pin_cores`): the CPUs of the process's affinity mask, in
//! order, so that under a cgroup cpuset (Kubernetes' static CPU manager gives a pod
//! exclusive CPUs such as 12–13; `taskset -c 1`) executor 0 goes to the first CPU the
//! process may use, not to CPU 0, which it may not.
//!
//! Guarantees: a pinned executor only ever names a CPU of the mask; more executors than
//! CPUs wrap around the mask; the mapping is one log line at start.

/// The CPUs the calling thread may run on, ascending (`sched_getaffinity`); empty if
/// the call fails.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the size passed is that of `set`, a live local.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE, the set's capacity.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Pins the calling thread to `cpu` (`sched_setaffinity`), for threads that are not
/// executors (benchmark tools); an error names the CPU.
pub fn pin_current_thread(cpu: usize) -> Result<(), String> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(format!("CPU {cpu}: beyond the CPU set"));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; `cpu` is below CPU_SETSIZE, the
    // set's capacity; sched_setaffinity reads the set for the calling thread (pid 0).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(format!("CPU {cpu}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The CPU of each of `cores` executors: `None` everywhere unless `pin`; else executor
/// `i` on `allowed[i % allowed.len()]` (`None` everywhere if the mask is unknown).
pub fn plan(cores: usize, pin: bool, allowed: &[usize]) -> Vec<Option<usize>> {
    (0..cores)
        .map(|i| (pin && !allowed.is_empty()).then(|| allowed[i % allowed.len()]))
        .collect()
}

/// glommio placements for `plan`: a pinned executor is fenced to a set of its one CPU
/// (`Placement::Fixed` would read the CPU topology again per executor, and panic when
/// that read fails, e.g. out of file descriptors).
pub fn placements(plan: &[Option<usize>]) -> Result<Vec<glommio::Placement>, String> {
    if plan.iter().all(Option::is_none) {
        return Ok(plan.iter().map(|_| glommio::Placement::Unbound).collect());
    }
    let online = glommio::CpuSet::online().map_err(|e| format!("reading the CPU topology: {e}"))?;
    plan.iter()
        .map(|c| match c {
            None => Ok(glommio::Placement::Unbound),
            Some(cpu) => {
                let set = online.clone().filter(|l| l.cpu == *cpu);
                if set.is_empty() {
                    Err(format!("CPU {cpu} of the affinity mask is not online"))
                } else {
                    Ok(glommio::Placement::Fenced(set))
                }
            }
        })
        .collect()
}

/// `0-3,8,10-11`.
pub fn ranges(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// The start-up line describing `plan` over the mask `allowed`.
pub fn describe(plan: &[Option<usize>], allowed: &[usize]) -> String {
    let mask = ranges(allowed);
    if plan.iter().all(Option::is_none) {
        return format!(
            "{} core(s) not pinned (pin_cores = false or no affinity mask); affinity mask CPUs {mask}",
            plan.len()
        );
    }
    let map: Vec<String> = plan
        .iter()
        .enumerate()
        .map(|(i, c)| match c {
            Some(c) => format!("core {i} -> CPU {c}"),
            None => format!("core {i} -> unpinned"),
        })
        .collect();
    let shared = if plan.len() > allowed.len() {
        " (more cores than CPUs: some CPUs run two)"
    } else {
        ""
    };
    format!(
        "pinning to the affinity mask CPUs {mask}: {}{shared}",
        map.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_pins_to_a_cpu_of_its_mask_and_not_beyond_the_set() {
        std::thread::spawn(|| {
            let cpu = *allowed_cpus().last().expect("a mask");
            pin_current_thread(cpu).unwrap();
            assert_eq!(allowed_cpus(), vec![cpu]);
            assert!(pin_current_thread(libc::CPU_SETSIZE as usize).is_err());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn executors_take_the_mask_in_order() {
        assert_eq!(plan(2, true, &[12, 13]), vec![Some(12), Some(13)]);
        assert_eq!(plan(1, true, &[1]), vec![Some(1)]);
        assert_eq!(plan(3, true, &[4, 6]), vec![Some(4), Some(6), Some(4)]);
        assert_eq!(plan(2, false, &[0, 1]), vec![None, None]);
        assert_eq!(plan(2, true, &[]), vec![None, None]);
        assert_eq!(
            describe(&plan(2, true, &[12, 13]), &[12, 13]),
            "pinning to the affinity mask CPUs 12-13: core 0 -> CPU 12, core 1 -> CPU 13"
        );
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        let me = allowed_cpus();
        assert!(!me.is_empty() && me.windows(2).all(|w| w[0] < w[1]));
    }
}
