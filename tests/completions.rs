//! The generated shell completions and man pages work with the tools that
//! read them: bash registers the completion function and completes
//! subcommands and flags; `man` renders a page.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{bin, run, text, TempDir};

/// bash's own completion machinery, driven by hand: what the completion
/// function offers after `pagefold se` and `pagefold serve --metr`.
#[test]
fn bash_completes_subcommands_and_flags() {
    let script = format!(
        r#"source <("{bin}" completions bash) || exit 1
complete -p pagefold || exit 1
offer() {{ COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${{#COMP_LINE}};
  COMPREPLY=(); _pagefold pagefold "${{COMP_WORDS[-1]}}" "${{COMP_WORDS[-2]}}"; echo "${{COMPREPLY[*]}}"; }}
offer pagefold se
offer pagefold serve --metr
"#,
        bin = bin().display()
    );
    let o = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].contains("-F _pagefold"), "{out}");
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["serve"],
        "{out}"
    );
    assert_eq!(lines[2].trim(), "--metrics-addr", "{out}");
}

/// `pagefold man --dir` writes pages that man(1) renders.
#[test]
fn man_pages_render() {
    let dir = TempDir::new("man");
    let o = run(
        &["man", "--dir", dir.path("man1").to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new("man")
        .arg("-l")
        .arg(dir.path("man1/pagefold-serve.1"))
        .env("MANWIDTH", "100")
        .env("PAGER", "cat")
        .output()
        .expect("this test needs man (Debian: man-db)");
    assert!(o.status.success(), "{}", text(&o));
    // Without a terminal, man marks bold as "c\bc": keep the last of each.
    let mut page = String::new();
    for c in String::from_utf8_lossy(&o.stdout).chars() {
        if c == '\u{8}' {
            page.pop();
        } else {
            page.push(c);
        }
    }
    assert!(page.contains("--metrics-addr"), "{page}");
    assert!(page.contains("pagefold-serve"), "{page}");
}
