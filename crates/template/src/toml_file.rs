//! Template files in TOML.

use crate::{Error, Result, TemplateSpec, MAX_FILE_BYTES};

/// Parses and validates a template file. Errors carry the `toml` crate's line, column and
/// snippet for syntax and field errors, and name the step for limit errors.
pub fn parse_toml(text: &str) -> Result<TemplateSpec> {
    if text.len() > MAX_FILE_BYTES {
        return Err(Error::Invalid(format!(
            "the template file is {} bytes, over the limit of {MAX_FILE_BYTES}",
            text.len()
        )));
    }
    let spec: TemplateSpec = toml::from_str(text)
        .map_err(|e| Error::Invalid(format!("template file: {}", e.to_string().trim_end())))?;
    spec.validate()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RunCmd, Step};

    #[test]
    fn a_full_file_parses_into_typed_steps() {
        let spec = parse_toml(
            r#"
name = "web"
base = "template:py"
[[steps]]
run = "apt-get install -y curl"
[[steps]]
run = ["python3", "-c", "print(1)"]
[[steps]]
upload = "app"
to = "/srv/app"
[[steps]]
file = "/etc/motd"
content = "hi\n"
mode = "600"
[[steps]]
env = { A = "1", B_2 = "x y" }
[[steps]]
workdir = "/srv/app"
[[steps]]
user = "nobody"
"#,
        )
        .unwrap();
        assert_eq!(spec.name, "web");
        assert_eq!(spec.base().unwrap(), crate::Base::Template("py".into()));
        assert_eq!(spec.steps.len(), 7);
        assert_eq!(
            spec.steps[1],
            Step::Run(RunCmd::Argv(vec!["python3".into(), "-c".into(), "print(1)".into()]))
        );
        assert_eq!(
            spec.steps[3],
            Step::File { path: "/etc/motd".into(), content: "hi\n".into(), mode: Some(0o600) }
        );
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<TemplateSpec>(&json).unwrap(), spec, "{json}");
    }

    fn err(text: &str) -> String {
        parse_toml(text).unwrap_err().to_string()
    }

    #[test]
    fn wrong_files_are_refused_naming_the_line_or_field() {
        let e = err("name = \"t\"\n[[steps]]\nrun = \"a\"\nenv = { A = \"1\" }\n");
        assert!(e.contains("run and env") && e.contains("line 2"), "{e}");
        let e = err("name = \"t\"\n[[steps]]\nrnu = \"a\"\n");
        assert!(e.contains("rnu") && e.contains("line 3"), "{e}");
        let e = err("name = \"t\"\n[[steps]]\nupload = \"../etc\"\nto = \"/x\"\n");
        assert!(e.contains("leaves the build context"), "{e}");
        let e = err("name = \"t\"\n[[steps]]\nupload = \"/etc\"\nto = \"/x\"\n");
        assert!(e.contains("leaves the build context"), "{e}");
        let e = err("name = \"t\"\n[[steps]]\nworkdir = \"rel\"\n");
        assert!(e.contains("not absolute"), "{e}");
        let e = err("name = \"t\"\n[[steps]]\nenv = { \"1A\" = \"x\" }\n");
        assert!(e.contains("\"1A\""), "{e}");
        let e = err("name = \"t\"\n[[steps]]\nuser = \"-rf\"\n");
        assert!(e.contains("user"), "{e}");
        let e = err("name = \"t\"\n[[steps]]\nrun = []\n");
        assert!(e.contains("empty"), "{e}");
        let e = err("name = \"t\"\n[[steps]]\nfile = \"/a\"\nmode = \"99\"\n");
        assert!(e.contains("octal"), "{e}");
        let e = err("name = \"snap-0123456789abcdef\"\n");
        assert!(e.contains("template name"), "{e}");
        let e = err("name = \"t\"\nbase = \"docker:x\"\n");
        assert!(e.contains("unknown kind"), "{e}");
        let e = err("name = \"t\"\n[[steps]]\nrun = \"a\\u0000b\"\n");
        assert!(e.contains("NUL"), "{e}");
    }

    #[test]
    fn limits_hold_before_and_after_parsing() {
        let big = format!("name = \"t\"\n# {}\n", "x".repeat(MAX_FILE_BYTES));
        assert!(err(&big).contains("over the limit"));
        let many = format!("name = \"t\"\n{}", "[[steps]]\nworkdir = \"/\"\n".repeat(crate::MAX_STEPS + 1));
        assert!(err(&many).contains("steps, over the limit"));
        let long =
            format!("name = \"t\"\n[[steps]]\nrun = \"{}\"\n", "y".repeat(crate::MAX_COMMAND_BYTES + 1));
        assert!(err(&long).contains("over the limit"));
        let deep = format!("name = \"t\"\nx = {}{}\n", "[".repeat(5000), "]".repeat(5000));
        assert!(parse_toml(&deep).is_err());
    }
}
