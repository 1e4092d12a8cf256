//! Keys whose value is one of a few words (`isolation`, `upgrade`).

use toml::Spanned;

use super::check::Check;

impl Check<'_> {
    /// The value of the word `value` names among `allowed` (the first is
    /// the default): absent, the default; any other word, a problem that
    /// lists the allowed ones, and the default.
    pub(super) fn choice<T: Copy>(
        &mut self,
        key: &str,
        value: Option<&Spanned<String>>,
        allowed: &[(&str, T)],
    ) -> T {
        let default = allowed[0].1;
        let Some(value) = value else { return default };
        if let Some((_, chosen)) = allowed.iter().find(|(word, _)| *word == value.get_ref()) {
            return *chosen;
        }
        let words: Vec<String> = allowed.iter().map(|(word, _)| format!("{word:?}")).collect();
        let words = match words.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => String::new(),
        };
        self.problem(value, format!("`{key}` = {:?}: allowed are {words}", value.get_ref()));
        default
    }
}
