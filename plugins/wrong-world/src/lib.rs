//! `wrong-world`: a valid component that is not a job handler. The host must
//! refuse it when it is listed as a plugin, naming what is missing.

wit_bindgen::generate!({
    inline: r"
        package pulse:wrong-world;

        world greeter {
            export greet: func(name: string) -> string;
        }
    ",
});

struct Greeter;

impl Guest for Greeter {
    fn greet(name: String) -> String {
        format!("hello, {name}")
    }
}

export!(Greeter);
