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
    fn jain_is_one_for_proportional_grants_and_falls_with_skew() {
        assert_eq!(jain(&[110.0, 220.0], &[100.0, 200.0]), Some(1.0));
        assert_eq!(jain(&[0.0, 100.0], &[50.0, 50.0]), Some(0.5));
        assert_eq!(jain(&[5.0], &[0.0]), None);
    }
}
