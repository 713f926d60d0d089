//! Delta debugging (ddmin, complements only): reduce a failing input to a smaller one that
//! still fails, by dropping chunks of halving size and finally single items.

/// The smallest list found that still `fails`: no single item can be dropped from it
/// without the failure going away. `items` must fail to begin with.
pub fn shrink<T: Clone>(mut items: Vec<T>, fails: impl Fn(&[T]) -> bool) -> Vec<T> {
    assert!(fails(&items), "shrink needs a failing input");
    let mut parts = 2usize;
    while items.len() >= 2 {
        let chunk = items.len().div_ceil(parts);
        let dropped = (0..items.len()).step_by(chunk).find_map(|start| {
            let end = (start + chunk).min(items.len());
            let rest: Vec<T> = items[..start].iter().chain(&items[end..]).cloned().collect();
            fails(&rest).then_some(rest)
        });
        match dropped {
            Some(rest) => {
                items = rest;
                parts = (parts - 1).max(2);
            }
            None if chunk == 1 => break,
            None => parts = (parts * 2).min(items.len()),
        }
    }
    if items.len() == 1 && fails(&[]) {
        items.clear();
    }
    items
}

/// Then, inside each remaining item, drops sub-items (e.g. the queries of a step) one by one
/// while the whole still fails.
pub fn shrink_within<T: Clone, U: Clone>(
    mut items: Vec<T>,
    parts: impl Fn(&mut T) -> &mut Vec<U>,
    fails: impl Fn(&[T]) -> bool,
) -> Vec<T> {
    for i in 0..items.len() {
        let mut j = 0;
        while j < parts(&mut items[i]).len() {
            let mut candidate = items.clone();
            parts(&mut candidate[i]).remove(j);
            if fails(&candidate) {
                items = candidate;
            } else {
                j += 1;
            }
        }
    }
    items
}
