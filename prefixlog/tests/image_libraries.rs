//! The images carry every shared library the binary links: for each library `ldd` resolves for
//! this build of `prefixlog`, the Debian package that ships it (`dpkg -S`) is installed by the
//! `Dockerfile`'s runtime stage and included in the local base (`scripts/build-images.sh`
//! INCLUDE) — except glibc and the gcc runtime, part of every Debian base. A new dynamic
//! dependency (libssl3 came with Kafka TLS) fails here, not in a container at 3 a.m.
//!
//! Needs a Debian host (dpkg, ldd): CI's. Elsewhere it prints NOT RUN and passes.

use std::collections::BTreeSet;
use std::process::Command;

/// In every Debian image, minbase and slim included.
const IN_EVERY_BASE: [&str; 2] = ["libc6", "libgcc-s1"];

fn root_file(path: &str) -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../").to_string() + path).unwrap()
}

/// The packages shipping the libraries the binary links (None: no dpkg / ldd here).
fn linked_packages() -> Option<BTreeSet<String>> {
    let ldd = Command::new("ldd").arg(env!("CARGO_BIN_EXE_prefixlog")).output().ok()?;
    assert!(ldd.status.success(), "ldd: {}", String::from_utf8_lossy(&ldd.stderr));
    let mut packages = BTreeSet::new();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // "libssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x...)"; the vDSO and the loader
        // have no "=> path".
        let Some((name, _)) = line.trim().split_once(" => /") else { continue };
        let owner = Command::new("dpkg").args(["-S", &format!("*/{name}")]).output().ok()?;
        assert!(owner.status.success(), "no Debian package ships {name}");
        // "libssl3:amd64: /usr/lib/x86_64-linux-gnu/libssl.so.3"
        let out = String::from_utf8_lossy(&owner.stdout);
        let package = out.lines().next().and_then(|l| l.split(':').next()).expect("dpkg -S output");
        packages.insert(package.to_string());
    }
    Some(packages)
}

#[test]
fn the_images_install_every_library_the_binary_links() {
    let Some(packages) = linked_packages() else {
        return eprintln!("[image_libraries] NOT RUN: needs ldd and dpkg (a Debian host)");
    };
    assert!(packages.contains("libssl3"), "the binary links OpenSSL (Kafka TLS): {packages:?}");
    let dockerfile = root_file("Dockerfile");
    let runtime = dockerfile.rsplit("FROM debian:").next().expect("a Debian runtime stage");
    let install =
        runtime.lines().find(|l| l.contains("apt-get install")).expect("the runtime's apt-get install");
    let build_images = root_file("scripts/build-images.sh");
    let include =
        build_images.lines().find_map(|l| l.strip_prefix("INCLUDE=")).expect("INCLUDE= in build-images.sh");
    let included: BTreeSet<&str> = include.split(',').collect();
    for p in packages.iter().filter(|p| !IN_EVERY_BASE.contains(&p.as_str())) {
        assert!(
            install.split_whitespace().any(|w| w == p),
            "the Dockerfile's runtime does not install {p}: {install}"
        );
        assert!(included.contains(p.as_str()), "build-images.sh INCLUDE lacks {p}: {include}");
    }
}
