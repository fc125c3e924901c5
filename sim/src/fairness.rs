//! The yardstick for fairness: the exact max-min fair split of a capacity over true demands,
//! and Jain's index of how close the grants came to it. Measurement only; the servers compute
//! their own shares.

/// Max-min fair shares of `capacity` among `demands`: everyone gets min(demand, level), the
/// level chosen so that the shares add up to the capacity (or everyone gets their demand).
pub fn max_min(demands: &[f64], capacity: f64) -> Vec<f64> {
    let mut sorted = demands.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut left = capacity;
    let mut level = f64::INFINITY;
    for (i, &demand) in sorted.iter().enumerate() {
        let share = left / (sorted.len() - i) as f64;
        if demand > share {
            level = share;
            break;
        }
        left -= demand;
    }
    demands.iter().map(|&demand| demand.min(level)).collect()
}

/// Weighted max-min shares of `capacity` among `(demand, weight)` pairs: everyone gets
/// min(demand, level · weight), the level chosen so that the shares add up to the capacity (or
/// everyone gets their demand). With weights of 1 this is [`max_min`].
pub fn weighted_max_min(demands: &[(f64, f64)], capacity: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..demands.len()).filter(|&i| demands[i].1 > 0.0).collect();
    order.sort_by(|&a, &b| (demands[a].0 / demands[a].1).total_cmp(&(demands[b].0 / demands[b].1)));
    let mut left = capacity;
    let mut weight: f64 = order.iter().map(|&i| demands[i].1).sum();
    let mut level = f64::INFINITY;
    for &i in &order {
        let (demand, w) = demands[i];
        if demand > left / weight * w {
            level = left / weight;
            break;
        }
        left -= demand;
        weight -= w;
    }
    demands.iter().map(|&(demand, w)| if w > 0.0 { demand.min(level * w) } else { 0.0 }).collect()
}

/// The split a server tree would make with perfect knowledge: each server divides what it got
/// among the servers and clients beneath it by weighted max-min over their aggregate demands,
/// weighted by how many clients each stands for — the most a tree that passes on Σ wants and
/// a count per child can achieve. `parents[s]`: server `s`'s parent (server 0 is the root,
/// parents come first); `clients`: each client's server and demand.
pub fn tree_split(capacity: f64, parents: &[Option<usize>], clients: &[(usize, f64)]) -> Vec<f64> {
    let n = parents.len();
    let mut aggregate = vec![(0.0, 0.0); n];
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, &(server, demand)) in clients.iter().enumerate() {
        aggregate[server].0 += demand;
        aggregate[server].1 += 1.0;
        members[server].push(i);
    }
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for s in (1..n).rev() {
        let parent = parents[s].expect("every server but the root has a parent");
        aggregate[parent].0 += aggregate[s].0;
        aggregate[parent].1 += aggregate[s].1;
        children[parent].push(s);
    }
    let mut share = vec![0.0; n];
    share[0] = capacity;
    let mut split = vec![0.0; clients.len()];
    for s in 0..n {
        let below = children[s].iter().map(|&k| aggregate[k]);
        let demands: Vec<(f64, f64)> = below.chain(members[s].iter().map(|&i| (clients[i].1, 1.0))).collect();
        let shares = weighted_max_min(&demands, share[s]);
        for (&k, &got) in children[s].iter().zip(&shares) {
            share[k] = got;
        }
        for (&i, &got) in members[s].iter().zip(&shares[children[s].len()..]) {
            split[i] = got;
        }
    }
    split
}

/// Jain's index of `grants` against `fair` shares: (Σx)² / (n·Σx²) with x = grant / fair over
/// those with a fair share; 1 when every grant is the same multiple of its fair share.
pub fn jain(grants: &[f64], fair: &[f64]) -> Option<f64> {
    let ratios = grants.iter().zip(fair).filter(|&(_, &fair)| fair > 0.0).map(|(&grant, &fair)| grant / fair);
    let (n, sum, squares) = ratios.fold((0.0, 0.0, 0.0), |(n, sum, squares), x| (n + 1.0, sum + x, squares + x * x));
    (squares > 0.0).then(|| sum * sum / (n * squares))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn water_filling() {
        assert_eq!(max_min(&[50.0, 400.0, 200.0, 50.0], 500.0), [50.0, 200.0, 200.0, 50.0]);
        assert_eq!(max_min(&[50.0, 400.0, 300.0], 500.0), [50.0, 225.0, 225.0]);
        assert_eq!(max_min(&[10.0, 20.0], 500.0), [10.0, 20.0]);
        assert_eq!(max_min(&[], 500.0), Vec::<f64>::new());
    }

    #[test]
    fn weighted_water_filling() {
        assert_eq!(weighted_max_min(&[(50.0, 1.0), (400.0, 1.0), (300.0, 1.0)], 500.0), [50.0, 225.0, 225.0]);
        // Levels per unit of weight: 20 for both heavy ones, the light one gets its demand.
        assert_eq!(weighted_max_min(&[(10.0, 1.0), (100.0, 3.0), (200.0, 1.0)], 90.0), [10.0, 60.0, 20.0]);
        assert_eq!(weighted_max_min(&[(10.0, 2.0)], 90.0), [10.0]);
    }

    #[test]
    fn a_tree_splits_by_aggregates() {
        // Root → two leaves. Leaf 1: demands 5 and 35 (40 over 2 clients); leaf 2: 30 and 30.
        // Capacity 80: the root gives each leaf 40, and leaf 1 gives its big client 35 — more
        // than the global max-min level of 25.
        let parents = [None, Some(0), Some(0)];
        let clients = [(1, 5.0), (1, 35.0), (2, 30.0), (2, 30.0)];
        assert_eq!(tree_split(80.0, &parents, &clients), [5.0, 35.0, 20.0, 20.0]);
        assert_eq!(max_min(&[5.0, 35.0, 30.0, 30.0], 80.0), [5.0, 25.0, 25.0, 25.0]);
    }

    #[test]
    fn jain_is_one_for_proportional_grants_and_falls_with_skew() {
        assert_eq!(jain(&[110.0, 220.0], &[100.0, 200.0]), Some(1.0));
        assert_eq!(jain(&[0.0, 100.0], &[50.0, 50.0]), Some(0.5));
        assert_eq!(jain(&[5.0], &[0.0]), None);
    }
}
